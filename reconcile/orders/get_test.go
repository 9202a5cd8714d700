package orders_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// Get reads an order with no transfer by a lighter statement and one with
// any by the whole one: both give what a checkout must see, whatever the
// order holds (nothing, a matched transfer, an orphaned one, a sighting in
// view, a sighting gone, a sighting whose transaction is recorded).
func TestGetListsExactlyTheOrdersTransfersWhateverItHolds(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	check := func(step string, o *paywatch.Order, wantIDs ...string) {
		t.Helper()
		got, err := s.Get(ctx, o.ID)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		var ids []string
		for _, tr := range got.Transfers {
			ids = append(ids, tr.ID)
		}
		if len(ids) != len(wantIDs) {
			t.Fatalf("%s: the order lists transfers %v, want %v", step, ids, wantIDs)
		}
		for i := range ids {
			if ids[i] != wantIDs[i] {
				t.Fatalf("%s: the order lists transfers %v, want %v", step, ids, wantIDs)
			}
		}
		if got.ID != o.ID || got.PayAmount.Cmp(o.PayAmount) != 0 || got.Status != o.Status {
			t.Fatalf("%s: read %s %s %s, want %s %s %s", step, got.ID, got.PayAmount, got.Status, o.ID, o.PayAmount, o.Status)
		}
	}
	eo, _, err := s.Create(ctx, req("e", usdt, 1_000_000))
	if err != nil {
		t.Fatal(err)
	}
	check("no transfer", eo)
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
		amount, block_number, block_hash, state, order_id, first_seen_at, updated_at)
		VALUES ('trf_1', 'ethereum', 'USDT', $2, '0xaa', 'log:0', 0, $3, 1, 10, '0xbb', 'seen', $1, now(), now())`,
		eo.ID, usdt.Contract, usdt.Addresses[0])
	check("a matched transfer", eo, "trf_1")
	pgtest.Exec(t, db, `UPDATE transfers SET state = 'orphaned' WHERE id = 'trf_1'`)
	check("an orphaned transfer", eo, "trf_1")

	bo, _, err := s.Create(ctx, req("b", btc, 100_000))
	if err != nil {
		t.Fatal(err)
	}
	check("no sighting", bo)
	pgtest.Exec(t, db, `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
		order_id, first_seen_at, updated_at)
		VALUES ('mtx_1', 'bitcoin', 'BTC', 'c1', 'vout:0', 0, $2, 100000, $1, now(), now())`, bo.ID, bo.PayAddress)
	check("a sighting in view", bo, "mtx_1")
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
		amount, block_number, block_hash, state, first_seen_at, updated_at)
		VALUES ('trf_2', 'bitcoin', 'BTC', '', 'c1', 'vout:0', 0, $1, 100000, 10, '0xbc', 'seen', now(), now())`, bo.PayAddress)
	check("a sighting whose transaction is recorded (not yet the order's)", bo)
	pgtest.Exec(t, db, `UPDATE mempool_transfers SET left_at = now(), left_reason = 'mined' WHERE id = 'mtx_1'`)
	check("a sighting gone", bo)

	// Tied by an update, as the reconciler, a claim and an operator tie
	// them: a transfer and a sighting recorded unmatched first.
	uo, _, err := s.Create(ctx, req("u", btc, 200_000))
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
		amount, block_number, block_hash, state, first_seen_at, updated_at)
		VALUES ('trf_3', 'bitcoin', 'BTC', '', 'c3', 'vout:0', 0, $1, 200000, 11, '0xbd', 'seen', now(), now())`, uo.PayAddress)
	pgtest.Exec(t, db, `INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount,
		first_seen_at, updated_at)
		VALUES ('mtx_2', 'bitcoin', 'BTC', 'c4', 'vout:0', 0, $1, 200000, now(), now())`, uo.PayAddress)
	check("an unmatched transfer and sighting to its address", uo)
	pgtest.Exec(t, db, `UPDATE mempool_transfers SET order_id = $1 WHERE id = 'mtx_2'`, uo.ID)
	check("a sighting tied by an update", uo, "mtx_2")
	pgtest.Exec(t, db, `UPDATE transfers SET order_id = $1 WHERE id = 'trf_3'`, uo.ID)
	check("a transfer tied by an update", uo, "trf_3", "mtx_2")
}

// Get reads an order with nothing to list by position (no mapping by
// name): every field comes back as List, which maps by name, reads it,
// each set to a value no other field has.
func TestGetReadsEveryFieldAsListDoes(t *testing.T) {
	db := pgtest.New(t)
	s, _ := newStore(t, db)
	ctx := context.Background()
	o, _, err := s.Create(ctx, req("every-field", usdt, 1_000_000))
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, db, `UPDATE orders SET status = 'disputed', dispute_reason = 'underpaid',
		customer_marked_paid_at = created_at + interval '1 minute', settled_at = created_at + interval '2 minutes',
		expires_at = created_at + interval '3 minutes', monitor_until = created_at + interval '4 minutes',
		tx_hash_hint = '0xhint', metadata = '{"cart": 7}' WHERE id = $1`, o.ID)
	got, err := s.Get(ctx, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	list, _, err := s.List(ctx, orders.Filter{ExternalID: "every-field", Limit: 10})
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v (%v)", list, err)
	}
	want := list[0]
	if len(got.Transfers) != 0 || len(want.Transfers) != 0 {
		t.Fatalf("transfers listed: %v and %v", got.Transfers, want.Transfers)
	}
	got.Transfers, want.Transfers = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Get read\n%+v\nList read\n%+v", *got, *want)
	}
	if got.CustomerMarkedPaidAt == nil || got.SettledAt == nil || got.TxHashHint == "" || len(got.Metadata) == 0 ||
		got.ExpiresAt.Equal(got.MonitorUntil) {
		t.Fatalf("a field was not read: %+v", *got)
	}
}

// A checkout page polling its order gets its answer when the pooled
// connections died while idle (the network reset them, as a load balancer
// dropping idle connections or a restarted server does): the read is made
// again on another connection, not answered with the reset. So are a
// storefront's list (its order by its own reference), a timeline and the
// operator's list of transfers.
func TestOrderReadsRunAgainAfterTheirConnectionDied(t *testing.T) {
	ctx := context.Background()
	_, dbURL := pgtest.NewWithURL(t)
	const pooled = 4
	p, db := pgtest.ProxiedPool(t, dbURL, pooled)
	s, _ := newStore(t, db)
	o, _, err := s.Create(ctx, req("poll-1", usdt, 5_000_000))
	if err != nil {
		t.Fatal(err)
	}
	reads := map[string]func() error{
		"get": func() error {
			got, err := s.Get(ctx, o.ID)
			if err == nil && got.ID != o.ID {
				t.Fatalf("read %s, want %s", got.ID, o.ID)
			}
			return err
		},
		"list by external id": func() error {
			got, _, err := s.List(ctx, orders.Filter{ExternalID: "poll-1", Limit: 10})
			if err == nil && (len(got) != 1 || got[0].ID != o.ID) {
				t.Fatalf("listed %v, want %s", got, o.ID)
			}
			return err
		},
		"transfers": func() error {
			_, _, err := s.ListTransfers(ctx, orders.TransferFilter{Limit: 10})
			return err
		},
		"timeline": func() error {
			got, err := s.Events(ctx, o.ID)
			if err == nil && len(got) == 0 {
				t.Fatal("an empty timeline")
			}
			return err
		},
	}
	for what, read := range reads {
		for round := range 3 {
			// Fill the pool with live idle connections, then reset them all.
			pgtest.FillPool(t, db, pooled)
			p.Reset()
			for i := range pooled {
				if err := read(); err != nil {
					t.Fatalf("%s, round %d, read %d: %v", what, round, i, err)
				}
			}
		}
	}
}
