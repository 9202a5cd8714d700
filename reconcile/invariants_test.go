package reconcile_test

import (
	"context"
	"strings"
	"testing"

	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
)

// Every invariant fires on a state that breaks it, and on nothing else of
// that state's kind: a check that cannot fail proves nothing.
func TestEveryInvariantSeesItsViolation(t *testing.T) {
	const order = `INSERT INTO orders (id, external_id, request_hash, network, asset, asset_contract, amount, pay_amount,
		pay_address, unique_k, status, dispute_reason, created_at, expires_at, monitor_until, updated_at, created_height,
		earliest_block_time) VALUES `
	const transfer = `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address, amount,
		block_number, block_hash, state, order_id, match_kind, provisional, first_seen_at, updated_at) VALUES `
	o := func(id, status string, k int) string {
		reason := "NULL"
		if status == "disputed" {
			reason = "'underpaid'"
		}
		return order + `('` + id + `', '` + id + `', '\x00', 'ethereum', 'USDT', 'c', 100, 100, '0xshop', ` +
			map[bool]string{true: "NULL", false: "0"}[k < 0] + `, '` + status + `', ` + reason + `,
			'2026-11-02 10:00Z', '2026-11-02 11:00Z', '2026-11-03 11:00Z', '2026-11-02 10:00Z', 10, '2026-11-02 09:55Z')`
	}
	tr := func(id, block, state, orderID, kind string, provisional bool) string {
		oid, mk := "NULL", "NULL"
		if orderID != "" {
			oid, mk = "'"+orderID+"'", "'"+kind+"'"
		}
		return transfer + `('` + id + `', 'ethereum', 'USDT', 'c', '0x` + id + `', 'k', 0, '0xshop', 100, ` + block +
			`, '0xb', '` + state + `', ` + oid + `, ` + mk + `, ` + map[bool]string{true: "true", false: "false"}[provisional] +
			`, now(), now())`
	}
	entry := func(id, account1, account2 string) string {
		return `INSERT INTO ledger_entries (id, at, kind, ref) VALUES (` + id + `, now(), 'receipt', 'r` + id + `');
			INSERT INTO ledger_postings (entry_id, account, network, asset, amount) VALUES
			(` + id + `, '` + account1 + `', 'ethereum', 'USDT', 100), (` + id + `, '` + account2 + `', 'ethereum', 'USDT', -100)`
	}
	cases := []struct {
		name  string
		setup []string
	}{
		{"transfer recorded twice", []string{`ALTER TABLE transfers DROP CONSTRAINT transfers_identity_key`,
			tr("a1", "20", "seen", "", "", false), strings.Replace(tr("a1", "20", "seen", "", "", false), "'a1'", "'a2'", 1)}},
		{"settled order without exact confirmed payment", []string{o("ord_s", "settled", 1)}},
		{"matched transfer on an order that ignores it", []string{o("ord_e", "expired", 1),
			tr("t1", "20", "seen", "ord_e", "amount", false)}},
		{"matched transfer on an order that ignores it", []string{o("ord_x", "cancelled", 1),
			tr("t1", "20", "orphaned", "ord_x", "amount", false)}},
		{"transfer matched to an order created after it was mined", []string{o("ord_c", "confirming", 1),
			tr("t1", "9", "seen", "ord_c", "hint", false)}},
		{"provisional transfer confirmed", []string{tr("t1", "20", "confirmed", "", "", true)}},
		{"transfer confirmed before its balance check", []string{tr("t1", "20", "confirmed", "", "", false),
			entry("1", "wallet:ethereum:0xshop", "suspense:ethereum:USDT"),
			`UPDATE transfers SET flags = '{balance_pending}' WHERE id = 't1'`}},
		{"order with transfers not marked so", []string{o("ord_c", "confirming", 1), tr("t1", "20", "seen", "ord_c", "amount", false),
			`UPDATE orders SET has_transfers = false WHERE id = 'ord_c'`}},
		{"orders that could take the same payment share a pay amount", []string{o("ord_1", "awaiting_payment", 1),
			strings.Replace(o("ord_2", "expired", 2), "'2026-11-02 10:00Z', '2026-11-02 11:00Z'", "'2026-11-02 10:30Z', '2026-11-02 11:30Z'", 1)}},
		{"wallet balance differs from confirmed transfers", []string{tr("t1", "20", "confirmed", "", "", false)}},
		{"suspense differs from unmatched confirmed transfers", []string{entry("1", "wallet:ethereum:0xshop", "suspense:ethereum:USDT")}},
		{"order account differs from its payments", []string{o("ord_d", "disputed", -1), entry("1", "suspense:ethereum:USDT", "order:ord_d")}},
		{"order account differs from its payments", []string{o("ord_r", "refunded", -1),
			tr("t1", "20", "confirmed", "ord_r", "address", false), entry("1", "wallet:ethereum:0xshop", "order:ord_r")}},
		{"settled or refunds owed differ from the payments of those orders", []string{entry("1", "order:ord_z", "refunds_owed:ethereum:USDT")}},
		{"status change the lifecycle does not allow", []string{o("ord_b", "awaiting_payment", 1),
			`INSERT INTO order_events (order_id, at, type, from_status, to_status, actor) VALUES
			('ord_b', now(), 'status_changed', 'settled', 'awaiting_payment', 'reconciler')`}},
		{"status change the lifecycle does not allow", []string{o("ord_b", "disputed", 1),
			`INSERT INTO order_events (order_id, at, type, from_status, to_status, actor, detail) VALUES
			('ord_b', now(), 'status_changed', 'expired', 'disputed', 'reconciler', '{"reason": "no_payment_found"}')`}},
		{"ledger entry does not balance", []string{`ALTER TABLE ledger_postings DISABLE TRIGGER ledger_postings_balanced`,
			`INSERT INTO ledger_entries (id, at, kind, ref) VALUES (1, now(), 'receipt', 'r');
			INSERT INTO ledger_postings (entry_id, account, network, asset, amount) VALUES (1, 'wallet:ethereum:0xshop', 'ethereum', 'USDT', 100)`}},
	}
	checked := map[string]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := pgtest.New(t)
			if err := reconcile.CheckInvariants(context.Background(), db); err != nil {
				t.Fatalf("an empty database breaks: %v", err)
			}
			for _, q := range c.setup {
				pgtest.Exec(t, db, q)
			}
			err := reconcile.CheckInvariants(context.Background(), db)
			if err == nil || !strings.Contains(err.Error(), c.name) {
				t.Fatalf("%q did not fire: %v", c.name, err)
			}
		})
		checked[c.name] = true
	}
	for _, inv := range reconcile.Invariants {
		if !checked[inv.Name] {
			t.Errorf("no case breaks %q", inv.Name)
		}
	}
}
