package reconcile_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// rescanCursor is a network's cursor as an operator sees it.
type rescanCursor struct {
	Number *int64  `db:"block_number"`
	Hash   *string `db:"block_hash"`
	Halted bool    `db:"halted"`
	Reorgs int     `db:"reorgs"`
	Blocks int     `db:"blocks"`
}

// rescanCursorOf reads a network's cursor.
func rescanCursorOf(f *fixture, network string) rescanCursor {
	f.t.Helper()
	var c rescanCursor
	if err := f.db.Get(&c, `SELECT block_number, block_hash, halted,
			(SELECT count(*) FROM chain_reorgs r WHERE r.network = c.network) AS reorgs,
			(SELECT count(*) FROM chain_blocks b WHERE b.network = c.network) AS blocks
		FROM chain_cursors c WHERE network = $1`, network); err != nil {
		f.t.Fatal(err)
	}
	return c
}

// README ("A halted network"): "`paywatch rescan` ... In one transaction
// it marks the transfers above `BLOCK - 1` orphaned ..., notes it on the
// affected dossiers' timelines and clears the halt". A rescan whose note
// on a timeline fails writes nothing: the paid order's payment is not
// orphaned, the network stays halted and its cursor where it was. Once
// the note can be written, the rescan goes through. scan.Store.Rewind is
// what the command runs.
func TestRescanIsOneTransaction(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	o := f.order(usdt, 5_000_000)
	tr := f.pay(payment{asset: usdt, to: shop, amount: o.PayAmount.Int64()})
	f.pass()
	f.expect(o, paywatch.StatusSettled, "")
	var block int64
	if err := f.db.Get(&block, `SELECT block_number FROM transfers WHERE id = $1`, tr); err != nil {
		t.Fatal(err)
	}
	// The scanner went past the payment, then met a reorg too deep.
	pgtest.Exec(t, f.db, `UPDATE chain_cursors SET block_number = head + 3, block_hash = '0xcur', halted = true
		WHERE network = 'ethereum'`)
	pgtest.Exec(t, f.db, `INSERT INTO chain_blocks (network, block_number, block_hash)
		SELECT 'ethereum', n, '0xb' || n FROM generate_series($1::bigint - 2, $1::bigint + 3) n`, block)
	before := rescanCursorOf(f, "ethereum")

	pgtest.Exec(t, f.db, `CREATE FUNCTION rescan_refuse_notes() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'timelines cannot be written now'; END $$`)
	pgtest.Exec(t, f.db, `CREATE TRIGGER rescan_refuse_notes BEFORE INSERT ON order_events FOR EACH ROW
		WHEN (NEW.type = 'transfer_orphaned') EXECUTE FUNCTION rescan_refuse_notes()`)
	to := scan.Block{Number: uint64(block - 1), Hash: "0xfork"}
	store := scan.NewStore(f.db)
	if _, err := store.Rewind(ctx, "ethereum", to); err == nil || !strings.Contains(err.Error(), "timelines cannot be written now") {
		t.Fatalf("the rescan returned %v, want its failed timeline note", err)
	}
	if got := rescanTransferState(f, tr); got != "confirmed" {
		t.Fatalf("the payment is %s after a failed rescan, want confirmed", got)
	}
	if got := f.transferOrder(tr); got != o.ID {
		t.Fatalf("the payment is on order %q after a failed rescan, want %s", got, o.ID)
	}
	if after := rescanCursorOf(f, "ethereum"); after.String() != before.String() {
		t.Fatalf("after a failed rescan the network is %s, was %s", after, before)
	}

	pgtest.Exec(t, f.db, `DROP TRIGGER rescan_refuse_notes ON order_events`)
	orphaned, err := store.Rewind(ctx, "ethereum", to)
	if err != nil || orphaned != 1 {
		t.Fatalf("the rescan orphaned %d transfers (%v), want 1", orphaned, err)
	}
	if got := rescanTransferState(f, tr); got != "orphaned" {
		t.Fatalf("the payment is %s after the rescan, want orphaned", got)
	}
	after := rescanCursorOf(f, "ethereum")
	if after.Halted || after.Number == nil || *after.Number != block-1 || *after.Hash != "0xfork" || after.Reorgs != 1 {
		t.Fatalf("after the rescan the network is %s; want block %d (0xfork), not halted, one rewind recorded",
			after, block-1)
	}
	if evs := f.events(o); !slices.Contains(evs, "transfer_orphaned") {
		t.Fatalf("the paid order's timeline has no transfer_orphaned note: %v", evs)
	}
}

// rescanTransferState returns a transfer's state.
func rescanTransferState(f *fixture, id string) string {
	f.t.Helper()
	var s string
	if err := f.db.Get(&s, `SELECT state FROM transfers WHERE id = $1`, id); err != nil {
		f.t.Fatal(err)
	}
	return s
}

// String says where the cursor is, whether the network is halted, and
// what is recorded of it.
func (c rescanCursor) String() string {
	n, h := "none", "none"
	if c.Number != nil {
		n = fmt.Sprint(*c.Number)
	}
	if c.Hash != nil {
		h = *c.Hash
	}
	return fmt.Sprintf("at block %s (%s), halted %t, %d rewinds recorded, %d block hashes kept", n, h, c.Halted, c.Reorgs, c.Blocks)
}
