package scan

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// fakeChain is a chain in memory: a Source for unit tests of the scanner's
// logic (the real-node tests live in chains/evm). Each block may hold one
// payment; maxRange makes it refuse wide scans.
type fakeChain struct {
	mu       sync.Mutex // the scanner reads ahead from another goroutine
	hashes   []string   // canonical hash by height
	payments map[uint64]int64
	maxRange uint64
	scans    [][2]uint64
	// onScan, when set, runs at each Scan (outside mu).
	onScan func()
}

func newFakeChain(n int) *fakeChain {
	c := &fakeChain{payments: map[uint64]int64{}}
	c.extend(n, "a")
	return c
}

func (c *fakeChain) extend(n int, fork string) {
	for i := 0; i < n; i++ {
		c.hashes = append(c.hashes, fmt.Sprintf("0x%s%d", fork, len(c.hashes)))
	}
}

// mine extends the chain by n blocks while a scanner may be reading it.
func (c *fakeChain) mine(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.extend(n, "a")
}

// reorg replaces the last depth blocks with new ones (and their payments).
func (c *fakeChain) reorg(depth int, fork string) {
	for h := len(c.hashes) - depth; h < len(c.hashes); h++ {
		delete(c.payments, uint64(h))
	}
	c.hashes = c.hashes[:len(c.hashes)-depth]
	c.extend(depth, fork)
}

func (c *fakeChain) Head(context.Context) (Head, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Head{Number: uint64(len(c.hashes) - 1)}, nil
}

func (c *fakeChain) BlockHash(_ context.Context, n uint64) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n >= uint64(len(c.hashes)) {
		return "", ErrNoBlock
	}
	return c.hashes[n], nil
}

var fakeAsset = &paywatch.Asset{Network: "fake", Symbol: "TOK", Contract: "0xc"}

func (c *fakeChain) Scan(_ context.Context, from, to uint64) (*Batch, error) {
	if c.onScan != nil {
		c.onScan()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.maxRange > 0 && to-from+1 > c.maxRange {
		return nil, fmt.Errorf("%w: %d blocks", ErrRangeTooLarge, to-from+1)
	}
	if to >= uint64(len(c.hashes)) {
		return nil, fmt.Errorf("blocks %d-%d: %w", from, to, ErrNoBlock)
	}
	c.scans = append(c.scans, [2]uint64{from, to})
	// With the head and the parent, as the EVM and Bitcoin sources give
	// them: the scanner takes a batch read ahead on its fast path.
	b := &Batch{Blocks: []Block{{Number: to, Hash: c.hashes[to]}}, Head: &Head{Number: uint64(len(c.hashes) - 1)}}
	if from > 0 {
		b.Parent = &Block{Number: from - 1, Hash: c.hashes[from-1]}
	}
	for n := from; n <= to; n++ {
		if amt, ok := c.payments[n]; ok {
			b.Transfers = append(b.Transfers, Found{Asset: fakeAsset, TxHash: fmt.Sprintf("0xt%d-%s", n, c.hashes[n]),
				TxKey: "k", To: "0xshop", Amount: big.NewInt(amt), BlockNumber: n, BlockHash: c.hashes[n]})
		}
	}
	return b, nil
}

func newTestScanner(t *testing.T, c *fakeChain) (*Scanner, *Store) {
	db := pgtest.New(t)
	store := NewStore(db)
	n := &paywatch.Network{Name: "fake", Confirmations: 2, PollInterval: time.Millisecond}
	return NewScanner(n, c, store, slog.New(slog.NewTextHandler(io.Discard, nil))), store
}

// caughtUp is a chain of n blocks, each from block paidFrom on holding a
// payment of 1, and a scanner (10 blocks a batch) that has caught up with
// it.
func caughtUp(t *testing.T, n int, paidFrom uint64) (*fakeChain, *Scanner, *Store) {
	t.Helper()
	c := newFakeChain(n)
	for b := paidFrom; b < uint64(n); b++ {
		c.payments[b] = 1
	}
	s, store := newTestScanner(t, c)
	s.MaxBatch = 10
	drain(t, s)
	return c, s, store
}

func drain(t *testing.T, s *Scanner) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		done, err := s.Step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return
		}
	}
	t.Fatal("never caught up")
}

func live(t *testing.T, store *Store) map[string]string {
	t.Helper()
	var rows []struct {
		Hash  string `db:"tx_hash"`
		State string `db:"state"`
	}
	if err := store.db.Select(&rows, `SELECT tx_hash, state FROM transfers`); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, r := range rows {
		out[r.Hash] = r.State
	}
	return out
}

// afterFork counts the orphaned and the live transfers, and fails the test
// if a transfer below the fork's first (its tx hash below fork) is orphaned.
func afterFork(t *testing.T, store *Store, fork string) (orphaned, seen int) {
	t.Helper()
	for h, state := range live(t, store) {
		switch {
		case state == "orphaned":
			orphaned++
			if h < fork {
				t.Fatalf("transfer %s below the fork orphaned", h)
			}
		default:
			seen++
		}
	}
	return orphaned, seen
}

// Refused ranges are halved until accepted, then grown back; no block is
// skipped or scanned twice.
func TestAdaptiveRange(t *testing.T) {
	c := newFakeChain(1000)
	for n := uint64(0); n < 1000; n += 37 {
		c.payments[n] = int64(n + 1)
	}
	c.maxRange = 100
	s, store := newTestScanner(t, c)
	s.MaxBatch = 800
	drain(t, s)
	next := uint64(0)
	// Two ranges are read at once: in the order of their blocks, they
	// follow each other, each read once.
	scans := slices.Clone(c.scans)
	slices.SortFunc(scans, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	for _, r := range scans {
		if r[0] != next || r[1]-r[0]+1 > 100 {
			t.Fatalf("scanned %v after block %d", r, next)
		}
		next = r[1] + 1
	}
	if next != 1000 || len(live(t, store)) != 28 {
		t.Fatalf("scanned up to %d, %d transfers", next, len(live(t, store)))
	}
	// Once the node accepts more, the batch grows back to the maximum.
	c.maxRange = 0
	c.extend(5000, "a")
	before := len(c.scans)
	drain(t, s)
	if widest := c.scans[len(c.scans)-1][1] - c.scans[len(c.scans)-1][0] + 1; len(c.scans)-before > 12 || widest < 400 {
		t.Fatalf("%d scans for 5000 blocks, last one %d wide: the range did not grow back", len(c.scans)-before, widest)
	}
}

// A reorg within the window orphans exactly the replaced blocks'
// transfers; one below the window halts the scanner and stays halted.
func TestReorgWalkBack(t *testing.T) {
	c, s, store := caughtUp(t, 50, 40)
	c.reorg(4, "b")
	c.payments[48] = 2
	drain(t, s)
	if orphaned, seen := afterFork(t, store, "0xt46"); orphaned != 4 || seen != 7 {
		t.Fatalf("%d orphaned, %d live; want 4 and 7", orphaned, seen)
	}
	// A scanner that keeps 5 blocks of hashes meets a 20-block reorg.
	c2 := newFakeChain(50)
	short, store2 := newTestScanner(t, c2)
	short.Window, short.MaxBatch = 5, 10
	drain(t, short)
	before := slices.Clone(c2.hashes)
	c2.reorg(20, "c")
	s = short
	_, err := s.Step(context.Background())
	if !errors.Is(err, ErrReorgTooDeep) {
		t.Fatalf("deep reorg: %v", err)
	}
	if err := store2.RecordStatus(context.Background(), "fake", nil, err.Error(), true); err != nil {
		t.Fatal(err)
	}
	// The chain goes back to what the scanner had seen: nothing left to
	// stop it but the halt, which only an operator's rewind clears.
	c2.mu.Lock()
	copy(c2.hashes, before)
	c2.mu.Unlock()
	for range 3 {
		if _, err := s.Step(context.Background()); !errors.Is(err, ErrReorgTooDeep) {
			t.Fatalf("a halted scanner resumed by itself: %v", err)
		}
	}
	cur, _, err := store2.Cursor(context.Background(), "fake")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store2.Rewind(context.Background(), "fake", *cur); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Step(context.Background()); err != nil {
		t.Fatalf("after the operator's rewind: %v", err)
	}
}

// A scanner starts each step from the cursor its last commit left, without
// reading it back. When the cursor moved meanwhile (an operator's rescan),
// the step commits nothing and says nothing is wrong; the next one reads
// the cursor and rescans from where the operator put it. A halt is checked
// by the commit itself, under the cursor's lock.
func TestACursorMovedUnderTheScannerIsReadAgain(t *testing.T) {
	c, s, store := caughtUp(t, 50, 10)
	c.mu.Lock()
	for n := uint64(50); n < 55; n++ {
		c.payments[n] = 1 // mined below
	}
	c.mu.Unlock()
	ctx := context.Background()
	if _, err := store.Rewind(ctx, "fake", Block{Number: 20, Hash: c.hashes[20]}); err != nil {
		t.Fatal(err)
	}
	c.mine(5)
	if _, err := s.Step(ctx); err != nil {
		t.Fatalf("the step after a rescan: %v, want none (the cursor is read again)", err)
	}
	if cur, _, err := store.Cursor(ctx, "fake"); err != nil || cur.Number != 20 {
		t.Fatalf("cursor %v (%v): the step from the old cursor wrote over the rescan's", cur, err)
	}
	drain(t, s)
	got := live(t, store)
	if len(got) != 45 {
		t.Fatalf("%d transfers, want 45 (blocks 10-54)", len(got))
	}
	for hash, state := range got {
		if state == "orphaned" {
			t.Errorf("%s still orphaned after the rescan", hash)
		}
	}
	if cur, _, err := store.Cursor(ctx, "fake"); err != nil || cur.Number != 54 {
		t.Fatalf("cursor %v (%v), want block 54", cur, err)
	}

	// A rescan and a reorg at the tip at once: the step checks the cursor
	// it remembered, finds it moved, and starts again from where the
	// operator put it (block 30, still canonical): no reorg is walked back
	// from the remembered one (whose hashes the rescan dropped), none is
	// reported.
	var logged strings.Builder
	s.Log = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if _, err := store.Rewind(ctx, "fake", Block{Number: 30, Hash: c.hashes[30]}); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.reorg(3, "r")
	c.payments[53] = 7
	c.mu.Unlock()
	if _, err := s.Step(ctx); err != nil {
		t.Fatalf("the step after a rescan and a reorg: %v, want none", err)
	}
	drain(t, s)
	if strings.Contains(logged.String(), "reorg") {
		t.Errorf("a reorg reported from the cursor the rescan moved:\n%s", logged.String())
	}
	got = live(t, store)
	if got["0xt53-0xr53"] != "confirmed" || got["0xt53-0xa53"] != "orphaned" {
		t.Fatalf("block 53 after the reorg: new fork's payment %q, old one's %q; want confirmed and orphaned",
			got["0xt53-0xr53"], got["0xt53-0xa53"])
	}

	// A step that read the cursor itself and finds it moved at its commit
	// (another instance, a rescan mid-step) fails as before; one that
	// started from the cursor it remembered counts the same failure, and
	// takes the step again at once.
	failed := &stepFailures{}
	s.Observer = failed
	fresh := NewScanner(s.Network, c, store, s.Log)
	fresh.MaxBatch = 10
	rewound := false
	c.onScan = func() {
		if !rewound {
			rewound = true
			if _, err := store.Rewind(ctx, "fake", Block{Number: 40, Hash: c.hashes[40]}); err != nil {
				t.Error(err)
			}
		}
	}
	c.mine(2)
	if _, err := fresh.Step(ctx); !errors.Is(err, ErrCursorMoved) {
		t.Fatalf("a step whose cursor moved under it: %v, want ErrCursorMoved", err)
	}
	c.onScan = nil
	if _, err := s.Step(ctx); err != nil {
		t.Fatalf("the remembered cursor moved: %v, want none", err)
	}
	if got := failed.kinds(); !slices.Equal(got, []string{"cursor_moved"}) {
		t.Fatalf("failures counted: %v, want one cursor_moved", got)
	}
	drain(t, s)

	// Halted meanwhile: the step from the known cursor commits nothing.
	if err := store.RecordStatus(ctx, "fake", nil, "halted by hand", true); err != nil {
		t.Fatal(err)
	}
	c.mine(3)
	if _, err := s.Step(ctx); !errors.Is(err, ErrReorgTooDeep) {
		t.Fatalf("a step of a halted scanner: %v, want ErrReorgTooDeep", err)
	}
	if cur, _, err := store.Cursor(ctx, "fake"); err != nil || cur.Number != 56 {
		t.Fatalf("cursor %v (%v): a halted scanner moved it", cur, err)
	}

	// Halted meanwhile, and the node lags behind the remembered cursor: the
	// halt stands, with its reason.
	if _, err := store.Rewind(ctx, "fake", Block{Number: 56, Hash: c.hashes[56]}); err != nil {
		t.Fatal(err)
	}
	drain(t, s)
	if err := store.RecordStatus(ctx, "fake", nil, "halted by hand again", true); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.hashes = c.hashes[:55]
	c.mu.Unlock()
	if _, err := s.Step(ctx); !errors.Is(err, ErrReorgTooDeep) {
		t.Fatalf("a step of a halted scanner behind a lagging node: %v, want ErrReorgTooDeep", err)
	}
	var why *string
	if err := store.db.Get(&why, `SELECT last_error FROM chain_cursors WHERE network = 'fake' AND halted`); err != nil ||
		why == nil || *why != "halted by hand again" {
		t.Fatalf("the halt's reason: %v (%v), want it kept", why, err)
	}
}

// stepFailures is an Observer that keeps the kinds of the failed steps.
type stepFailures struct {
	mu   sync.Mutex
	seen []string
}

func (f *stepFailures) Batch(string, int, int, time.Duration) {}

func (f *stepFailures) StepFailed(_, kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, kind)
}

func (f *stepFailures) kinds() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

// The n-th retry waits min·2^(n-1), capped at max, less up to half of it
// (jitter): it grows, and stays within the scanner's 0.5 s and 30 s.
func TestBackoffGrowsCappedWithJitter(t *testing.T) {
	for n := 1; n < 20; n++ {
		step := DefaultRetryMin << (n - 1)
		if step > DefaultRetryMax || step <= 0 {
			step = DefaultRetryMax
		}
		lowest, highest := step, time.Duration(0)
		for range 200 {
			d := backoff(DefaultRetryMin, DefaultRetryMax, n)
			if d < step/2 || d > step {
				t.Fatalf("retry %d waits %s, want %s to %s", n, d, step/2, step)
			}
			lowest, highest = min(lowest, d), max(highest, d)
		}
		if highest-lowest < step/4 {
			t.Fatalf("retry %d: waits from %s to %s, no jitter", n, lowest, highest)
		}
	}
	if d := backoff(DefaultRetryMin, DefaultRetryMax, 1); d < 250*time.Millisecond || d > 500*time.Millisecond {
		t.Fatalf("first retry waits %s, want 0.25 s to 0.5 s", d)
	}
	if d := backoff(DefaultRetryMin, DefaultRetryMax, 50); d < 15*time.Second || d > 30*time.Second {
		t.Fatalf("a long outage's retries wait %s, want 15 s to 30 s", d)
	}
}

// Transfers a look-up recorded ahead of the scanner are provisional: the
// scanner adopts those it sees in their blocks and orphans those it passes
// without seeing; neither is confirmed before. A look-up never changes what
// the scanner recorded, and records nothing at or below its cursor.
func TestLookupRecordsAreProvisional(t *testing.T) {
	c := newFakeChain(10)
	c.payments[5] = 50
	s, store := newTestScanner(t, c)
	drain(t, s)
	c.extend(5, "a") // blocks 10 to 14
	c.payments[12] = 120
	ctx := context.Background()
	tx := func(n uint64, hash string, amount int64) Found {
		return Found{Asset: fakeAsset, TxHash: fmt.Sprintf("0xt%d-%s", n, hash), TxKey: "k", To: "0xshop",
			Amount: big.NewInt(amount), BlockNumber: n, BlockHash: hash}
	}
	if err := store.Record(ctx, "fake", []Found{
		tx(3, "0xold", 30),         // below the cursor: the scanner passed it
		tx(5, "0xelsewhere", 50),   // the scanner's own, "seen" elsewhere by a lying node
		tx(12, c.hashes[12], 120),  // ahead, on the chain
		tx(13, "0xnot-mined", 130), // ahead, not on the chain
	}); err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Hash        string `db:"tx_hash"`
		Block       string `db:"block_hash"`
		State       string `db:"state"`
		Provisional bool   `db:"provisional"`
	}
	read := func() map[uint64]string {
		rows = rows[:0]
		if err := store.db.Select(&rows, `SELECT tx_hash, block_hash, state, provisional FROM transfers ORDER BY block_number`); err != nil {
			t.Fatal(err)
		}
		out := map[uint64]string{}
		for _, r := range rows {
			var n uint64
			fmt.Sscanf(r.Hash, "0xt%d-", &n)
			out[n] = fmt.Sprintf("%s %s provisional=%v", r.State, r.Block, r.Provisional)
		}
		return out
	}
	got := read()
	want := map[uint64]string{
		5:  "confirmed " + c.hashes[5] + " provisional=false",
		12: "seen " + c.hashes[12] + " provisional=true",
		13: "seen 0xnot-mined provisional=true",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the look-up:\n got %v\nwant %v", got, want)
	}
	drain(t, s)
	got = read()
	want[12] = "confirmed " + c.hashes[12] + " provisional=false"
	want[13] = "orphaned 0xnot-mined provisional=true"
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the scanner passed:\n got %v\nwant %v", got, want)
	}
}

// strayChain is a fakeChain whose source, while stray is set, answers a
// range with a transfer or a block hash from beyond it (real ones, with
// their canonical hashes), as a node or relay that ignores the range asked
// for would.
type strayChain struct {
	*fakeChain
	stray       bool
	strayBlock  bool // a block hash beyond the range, not a transfer
	strayHeight uint64
}

func (c *strayChain) Scan(ctx context.Context, from, to uint64) (*Batch, error) {
	b, err := c.fakeChain.Scan(ctx, from, to)
	if err != nil || !c.stray {
		return b, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.strayHeight
	if c.strayBlock {
		b.Blocks = append(b.Blocks, Block{Number: n, Hash: c.hashes[n]})
		return b, nil
	}
	b.Transfers = append(b.Transfers, Found{Asset: fakeAsset, TxHash: fmt.Sprintf("0xt%d-%s", n, c.hashes[n]), TxKey: "k",
		To: "0xshop", Amount: big.NewInt(1), BlockNumber: n, BlockHash: c.hashes[n]})
	return b, nil
}

// A batch holding a transfer or a block from beyond its range is refused:
// the cursor stays where it was, and once the source answers for the range
// again, no payment in the blocks it would have jumped is lost.
func TestABatchFromBeyondItsRangeMovesNothing(t *testing.T) {
	for _, strayBlock := range []bool{false, true} {
		c := &strayChain{fakeChain: newFakeChain(300), stray: true, strayBlock: strayBlock, strayHeight: 250}
		c.payments[50] = 5
		store := NewStore(pgtest.New(t))
		s := NewScanner(&paywatch.Network{Name: "fake", Confirmations: 2, PollInterval: time.Millisecond}, c, store,
			slog.New(slog.NewTextHandler(io.Discard, nil)))
		s.MaxBatch = 20
		_, err := s.Step(context.Background())
		if err == nil || !strings.Contains(err.Error(), "the source answered for blocks 0-19 with") {
			t.Fatalf("stray block %v: step: %v, want the batch refused", strayBlock, err)
		}
		if cur, _, err := store.Cursor(context.Background(), "fake"); err != nil || cur != nil {
			t.Fatalf("stray block %v: cursor %+v (%v), want none", strayBlock, cur, err)
		}
		c.stray = false
		drain(t, s)
		got := live(t, store)
		if _, ok := got["0xt50-0xa50"]; !ok || len(got) != 1 {
			t.Fatalf("stray block %v: transfers %v, want the payment in block 50 alone", strayBlock, got)
		}
	}
}
