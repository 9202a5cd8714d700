package orders_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// README: "Changes are pushed by PostgreSQL LISTEN/NOTIFY: triggers on
// orders, transfers and mempool sightings announce the order's id, and the
// scanners' commits announce new blocks (confirmations)". No write here
// announces anything by hand: a change of an order, or a write of a
// transfers or mempool_transfers row of an order, wakes that order's
// waiters (and no other order's); a write that changes no order's view
// wakes no one; a scanner's commit wakes the waiters that follow that
// network's blocks.
func TestChangesAreAnnouncedByTriggersAndScannerCommits(t *testing.T) {
	db, dsn := pgtest.NewWithURL(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, _ := newStore(t, db)
	mine, _, err := s.Create(ctx, req("trig-mine", usdt, 1_000_000))
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := s.Create(ctx, req("trig-other", usdt, 2_000_000))
	if err != nil {
		t.Fatal(err)
	}
	c := orders.NewChanges(dsn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	go func() { _ = c.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := db.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND query ILIKE 'LISTEN%' || $1 || '%'`, pg.NotifyChannel); err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the change listener never listened")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The waiter of mine follows its own changes only (no payment yet);
	// that of other follows its changes and ethereum's blocks.
	woke, stop1 := c.Subscribe(mine.ID, "")
	defer stop1()
	bystander, stop2 := c.Subscribe(other.ID, "ethereum")
	defer stop2()
	// After each write a marker is announced on the same channel: the
	// listener hands notifications over in commit order, so once the
	// marker's waiter wakes, whatever the write announced has been handed
	// over too, and a waiter not woken by then was not announced.
	marker, stop3 := c.Subscribe("ord_marker", "")
	defer stop3()
	woken := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	step := func(what string, wantMine, wantOther bool, write func()) {
		t.Helper()
		write()
		pgtest.Exec(t, db, `SELECT pg_notify($1, 'ord_marker')`, pg.OrderChannel)
		select {
		case <-marker:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the marker announced after it never arrived", what)
		}
		if got := woken(woke); got != wantMine {
			t.Fatalf("%s: the waiter of order %s woken %v, want %v", what, mine.ID, got, wantMine)
		}
		if got := woken(bystander); got != wantOther {
			t.Fatalf("%s: the waiter of order %s (following ethereum's blocks) woken %v, want %v", what, other.ID, got, wantOther)
		}
	}

	step("the order marked paid", true, false, func() {
		if _, err := s.MarkPaid(ctx, mine.ID, "", "shop"); err != nil {
			t.Fatal(err)
		}
	})
	step("the order touched without a change its view shows", false, false, func() {
		pgtest.Exec(t, db, `UPDATE orders SET updated_at = now() WHERE id = $1`, mine.ID)
	})
	step("a transfer of no order recorded", false, false, func() {
		pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
			amount, block_number, block_hash, state, first_seen_at, updated_at)
			VALUES ('trf_stray', 'ethereum', 'USDT', $1, '0xa1', 'log:0', 0, $2, 5, 10, '0xb10', 'seen', now(), now())`,
			usdt.Contract, usdt.Addresses[0])
	})
	step("a transfer of the order recorded", true, false, func() {
		pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
			amount, block_number, block_hash, state, order_id, first_seen_at, updated_at)
			VALUES ('trf_mine', 'ethereum', 'USDT', $1, '0xa2', 'log:0', 0, $2, 1000000, 11, '0xb11', 'seen', $3, now(), now())`,
			usdt.Contract, usdt.Addresses[0], mine.ID)
	})
	step("the order's transfer confirmed", true, false, func() {
		pgtest.Exec(t, db, `UPDATE transfers SET state = 'confirmed' WHERE id = 'trf_mine'`)
	})
	step("a stray transfer matched to the order", true, false, func() {
		pgtest.Exec(t, db, `UPDATE transfers SET order_id = $1 WHERE id = 'trf_stray'`, mine.ID)
	})
	step("a transfer moved from the order to another", true, true, func() {
		pgtest.Exec(t, db, `UPDATE transfers SET order_id = $1 WHERE id = 'trf_stray'`, other.ID)
	})
	step("a mempool sighting of the order recorded", true, false, func() {
		pgtest.Exec(t, db, `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
			order_id, first_seen_at, updated_at)
			VALUES ('mtx_mine', 'bitcoin', 'BTC', 'c1', 'vout:0', 0, 'bcrt1qmine', 100000, $1, now(), now())`, mine.ID)
	})
	step("the order's mempool sighting left the mempool", true, false, func() {
		pgtest.Exec(t, db, `UPDATE mempool_transfers SET left_at = now(), left_reason = 'dropped' WHERE id = 'mtx_mine'`)
	})
	step("a mempool sighting of no order recorded", false, false, func() {
		pgtest.Exec(t, db, `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
			first_seen_at, updated_at)
			VALUES ('mtx_stray', 'bitcoin', 'BTC', 'c2', 'vout:0', 0, 'bcrt1qstray', 5, now(), now())`)
	})
	// A scanner commits blocks of ethereum: the waiter following its
	// blocks wakes, the other does not.
	chains := scan.NewStore(db)
	step("a scanner commit on ethereum", false, true, func() {
		if _, err := chains.Commit(ctx, scan.Commit{Network: "ethereum", Batch: &scan.Batch{},
			Cursor: &scan.Block{Number: 20, Hash: "0xc20"}, Head: scan.Head{Number: 25}, First: 11}); err != nil {
			t.Fatal(err)
		}
	})
	step("a scanner commit on bitcoin", false, false, func() {
		if _, err := chains.Commit(ctx, scan.Commit{Network: "bitcoin", Batch: &scan.Batch{},
			Cursor: &scan.Block{Number: 7, Hash: "0xd7"}, Head: scan.Head{Number: 7}, First: 1}); err != nil {
			t.Fatal(err)
		}
	})
}
