package orders

import (
	"context"
	"errors"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// drawFree draws distinct free ks, in the order drawn: with the smallest
// draw each time, the smallest free ks in order; never a taken one; fewer
// when fewer are free.
func TestDrawFreeDrawsDistinctFreeSlots(t *testing.T) {
	first := func(int) (int, error) { return 0, nil }
	taken := map[int]bool{0: true, 2: true, 3: true, 7: true}
	ks, err := drawFree(10, taken, 4, first)
	if err != nil || !slices.Equal(ks, []int{1, 4, 5, 6}) {
		t.Fatalf("smallest draws: %v %v, want [1 4 5 6]", ks, err)
	}
	last := func(n int) (int, error) { return n - 1, nil }
	if ks, _ := drawFree(10, taken, 3, last); !slices.Equal(ks, []int{9, 8, 6}) {
		t.Fatalf("largest draws: %v, want [9 8 6]", ks)
	}
	if ks, _ := drawFree(10, taken, 8, first); !slices.Equal(ks, []int{1, 4, 5, 6, 8, 9}) {
		t.Fatalf("more wanted than free: %v, want the 6 free", ks)
	}
	all := map[int]bool{0: true, 1: true}
	if ks, _ := drawFree(2, all, 8, first); len(ks) != 0 {
		t.Fatalf("none free: %v", ks)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	draw := func(n int) (int, error) { return rng.IntN(n), nil }
	for range 2000 {
		ks, err := drawFree(20, taken, 8, draw)
		if err != nil || len(ks) != 8 {
			t.Fatalf("%v %v", ks, err)
		}
		seen := map[int]bool{}
		for _, k := range ks {
			if k < 0 || k >= 20 || taken[k] || seen[k] {
				t.Fatalf("draw %v: %d taken, out of range or twice", ks, k)
			}
			seen[k] = true
		}
	}
	// The first draw is uniform among the 16 free: over 32,000 draws each
	// comes first about 2,000 times.
	firsts := map[int]int{}
	for range 32_000 {
		ks, _ := drawFree(20, taken, 3, draw)
		firsts[ks[0]]++
	}
	for k := range 20 {
		if n := firsts[k]; (taken[k] && n != 0) || (!taken[k] && (n < 1700 || n > 2300)) {
			t.Fatalf("k = %d came first %d times of 32,000 (taken: %v)", k, n, taken[k])
		}
	}
}

// A slot another order holds is never written over: holdSlot says the
// slot was taken, which sends the creation round again.
func TestHoldSlotRefusesAHeldSlot(t *testing.T) {
	db := pgtest.New(t)
	fx := reconciletest.NewFixtures()
	s := NewStore(db, 24*time.Hour, reconciletest.Wallets(t))
	s.Rand = reconciletest.FirstSlot
	ctx := context.Background()
	held, _, err := s.Create(ctx, CreateRequest{ExternalID: "held", Network: fx.Ethereum, Asset: fx.USDT,
		Amount: big.NewInt(10), ExpiresIn: time.Hour, Actor: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	now := s.now()
	slot := &slotChoice{address: held.PayAddress, payAmount: held.PayAmount}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := s.holdSlot(ctx, tx, fx.USDT, slot, "ord_other", now.Add(time.Hour), now); !errors.Is(err, errSlotTaken) {
		t.Fatalf("holding a held slot: %v, want errSlotTaken", err)
	}
	var holder string
	if err := tx.Get(&holder, `SELECT order_id FROM amount_slots`); err != nil || holder != held.ID {
		t.Fatalf("the slot's holder is %q (%v), want %s", holder, err, held.ID)
	}
}

// Creations take turns in the database, first come first served, and one
// whose context ends while it waits writes nothing.
func TestCreationsTakeTurns(t *testing.T) {
	db := pgtest.New(t)
	fx := reconciletest.NewFixtures()
	s := NewStore(db, 24*time.Hour, reconciletest.Wallets(t))
	s.Rand = reconciletest.FirstSlot
	s.creating = make(chan struct{}, 1)
	create := func(ctx context.Context, ext string) error {
		_, _, err := s.Create(ctx, CreateRequest{ExternalID: ext, Network: fx.Ethereum, Asset: fx.USDT,
			Amount: big.NewInt(10), ExpiresIn: time.Hour, Actor: "shop"})
		return err
	}
	s.creating <- struct{}{} // a creation in the database
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := create(ctx, "gave-up"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a creation whose context ended while it waited: %v", err)
	}
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM orders`); err != nil || n != 0 {
		t.Fatalf("%d orders (%v), want none", n, err)
	}
	// Three wait, one after the other; they go in that order.
	errs := make(chan error, 3)
	for _, ext := range []string{"first", "second", "third"} {
		go func() { errs <- create(context.Background(), ext) }()
		time.Sleep(200 * time.Millisecond) // until it waits
	}
	<-s.creating
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var order []string
	if err := db.Select(&order, `SELECT o.external_id FROM order_events e JOIN orders o ON o.id = e.order_id ORDER BY e.id`); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(order, []string{"first", "second", "third"}) {
		t.Fatalf("created in the order %v, want first, second, third", order)
	}
}

// LimitCreations bounds the creations in the database at once: at least
// one, at most maxCreating (serve gives the API pool's size less one, so
// that a burst of creations leaves a connection to the reads).
func TestLimitCreations(t *testing.T) {
	s := NewStore(nil, time.Hour, nil)
	for _, c := range []struct{ n, want int }{{3, 3}, {0, 1}, {-2, 1}, {maxCreating + 5, maxCreating}} {
		s.LimitCreations(c.n)
		if got := cap(s.creating); got != c.want {
			t.Errorf("LimitCreations(%d): %d at once, want %d", c.n, got, c.want)
		}
	}
}
