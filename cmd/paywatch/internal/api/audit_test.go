package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// README: "Auth is Authorization: Bearer <key>; an operator key can do
// everything a storefront key can." With an operator key alone, every
// storefront endpoint answers as it does to a storefront: create (201, and
// 200 on replay), read, list, long-poll, "I've paid" and cancel; the
// timeline names the operator's key as the actor.
func TestOperatorKeyCanDoEverythingAStorefrontKeyCan(t *testing.T) {
	f := newFixture(t)
	body := `{"external_id":"op-1","network":"ethereum","asset":"USDT","amount":"7"}`
	res := f.do("POST", "/v1/orders", operatorKey, body)
	if res.status != http.StatusCreated {
		t.Fatalf("create with an operator key: %d %s, want 201", res.status, res.body)
	}
	var o orderJSON
	res.decode(t, &o)
	if res := f.do("POST", "/v1/orders", operatorKey, body); res.status != http.StatusOK {
		t.Fatalf("replayed create with an operator key: %d %s, want 200", res.status, res.body)
	}
	res = f.do("GET", "/v1/orders/"+o.ID, operatorKey, "")
	if res.status != http.StatusOK || res.header.Get("ETag") == "" {
		t.Fatalf("read with an operator key: %d (ETag %q) %s, want 200 with an ETag", res.status, res.header.Get("ETag"), res.body)
	}
	if res := f.do("GET", "/v1/orders/"+o.ID+"?wait=1s", operatorKey, "", "If-None-Match", res.header.Get("ETag")); res.status != http.StatusNotModified {
		t.Fatalf("long-poll with an operator key: %d %s, want 304 (no change notifications here: answered at once)", res.status, res.body)
	}
	var list struct {
		Data []orderJSON `json:"data"`
	}
	res = f.do("GET", "/v1/orders?external_id=op-1", operatorKey, "")
	res.decode(t, &list)
	if res.status != http.StatusOK || len(list.Data) != 1 || list.Data[0].ID != o.ID {
		t.Fatalf("list with an operator key: %d %s, want 200 with the order", res.status, res.body)
	}
	res = f.do("POST", "/v1/orders/"+o.ID+"/paid", operatorKey, `{"tx_hash":"0x`+strings.Repeat("ab", 32)+`"}`)
	var paid orderJSON
	res.decode(t, &paid)
	if res.status != http.StatusOK || paid.CustomerMarkedPaidAt == nil {
		t.Fatalf("\"I've paid\" with an operator key: %d %s, want 200 and the order marked paid", res.status, res.body)
	}
	var o2 orderJSON
	if res := f.do("POST", "/v1/orders", operatorKey, `{"external_id":"op-2","network":"ethereum","asset":"USDT","amount":"8"}`); res.status != http.StatusCreated {
		t.Fatalf("second create with an operator key: %d %s", res.status, res.body)
	} else {
		res.decode(t, &o2)
	}
	res = f.do("POST", "/v1/orders/"+o2.ID+"/cancel", operatorKey, "")
	var cancelled orderJSON
	res.decode(t, &cancelled)
	if res.status != http.StatusOK || cancelled.Status != "cancelled" {
		t.Fatalf("cancel with an operator key: %d %s, want 200 and the order cancelled", res.status, res.body)
	}
	var events []struct{ Type, Actor string }
	f.do("GET", "/v1/orders/"+o.ID+"/events", operatorKey, "").decode(t, &events)
	var actors []string
	for _, e := range events {
		if e.Type == "customer_marked_paid" {
			actors = append(actors, e.Actor)
		}
	}
	if len(actors) != 1 || actors[0] != "alice" {
		t.Fatalf("\"I've paid\" with the operator key alice is on the timeline with actors %q, want [alice]", actors)
	}
}

// README: "POST /v1/transfers/{id}/attach … except that a token transfer
// whose balance check has not run yet (balance_pending) cannot be attached
// until it has (409, a few seconds)". The API answers 409 invalid_state
// with a message saying the check has not run, and writes nothing; once
// the verdict is in, the same attach succeeds.
func TestAttachOfABalancePendingTransferAnswers409InvalidState(t *testing.T) {
	f := newFixture(t)
	var o orderJSON
	f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"pend-1","network":"ethereum","asset":"USDT","amount":"10"}`).decode(t, &o)
	pgtest.Exec(t, f.db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
		amount, block_number, block_hash, state, flags, first_seen_at, updated_at)
		VALUES ('trf_pending', 'ethereum', 'USDT', '0xdAC17F958D2ee523a2206206994597C13D831ec7', '0xaa', 'k', 0,
		'0x1111111111111111111111111111111111111111', 9000000, 5, '0xbb', 'seen', '{balance_pending}', now(), now())`)
	before := f.rows()
	res := f.do("POST", "/v1/transfers/trf_pending/attach", operatorKey, `{"order_id":"`+o.ID+`","note":"paid from an exchange"}`)
	if res.status != http.StatusConflict || res.code() != "invalid_state" || !strings.Contains(res.message(), "balance check") {
		t.Fatalf("attach of a balance_pending transfer: %d %s, want 409 invalid_state saying it waits for its balance check", res.status, res.body)
	}
	var matched *string
	if err := f.db.Get(&matched, `SELECT order_id FROM transfers WHERE id = 'trf_pending'`); err != nil || matched != nil || f.rows() != before {
		t.Fatalf("the refused attach wrote: transfer matched to %v (%v), rows %v then %v", matched, err, before, f.rows())
	}
	// The verdict comes (the balance moved): the attach goes through.
	pgtest.Exec(t, f.db, `UPDATE transfers SET flags = '{}' WHERE id = 'trf_pending'`)
	if res := f.do("POST", "/v1/transfers/trf_pending/attach", operatorKey, `{"order_id":"`+o.ID+`","note":"paid from an exchange"}`); res.status != http.StatusOK {
		t.Fatalf("attach once the balance check passed: %d %s, want 200", res.status, res.body)
	}
}

// README: "An order whose payments still wait for confirmations is not
// resolved (409 invalid_state): resolve it once they count." A disputed
// order with a payment not yet confirmed: POST /v1/orders/{id}/resolve
// answers 409 invalid_state saying so, and the order stays disputed; once
// the payment is confirmed the same request resolves it.
func TestResolveOfAnOrderWithUnconfirmedPaymentsAnswers409InvalidState(t *testing.T) {
	f := newFixture(t)
	var o orderJSON
	f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"unconf-1","network":"ethereum","asset":"USDT","amount":"10"}`).decode(t, &o)
	pgtest.Exec(t, f.db, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx, to_address,
		amount, block_number, block_hash, state, order_id, match_kind, first_seen_at, updated_at)
		VALUES ('trf_unconf', 'ethereum', 'USDT', '0xdAC17F958D2ee523a2206206994597C13D831ec7', '0xaa', 'k', 0,
		'0x1111111111111111111111111111111111111111', 12000000, 5, '0xbb', 'seen', $1, 'amount', now(), now())`, o.ID)
	pgtest.Exec(t, f.db, `UPDATE orders SET status = 'disputed', dispute_reason = 'overpaid' WHERE id = $1`, o.ID)
	res := f.do("POST", "/v1/orders/"+o.ID+"/resolve", operatorKey, `{"outcome":"refunded","note":"send back the excess"}`)
	if res.status != http.StatusConflict || res.code() != "invalid_state" || !strings.Contains(res.message(), "confirmations") {
		t.Fatalf("resolve with an unconfirmed payment: %d %s, want 409 invalid_state saying payments wait for confirmations", res.status, res.body)
	}
	var got orderJSON
	f.do("GET", "/v1/orders/"+o.ID, storefrontKey, "").decode(t, &got)
	if got.Status != "disputed" {
		t.Fatalf("after a refused resolve the order is %s, want still disputed", got.Status)
	}
	pgtest.Exec(t, f.db, `UPDATE transfers SET state = 'confirmed' WHERE id = 'trf_unconf'`)
	res = f.do("POST", "/v1/orders/"+o.ID+"/resolve", operatorKey, `{"outcome":"refunded","note":"send back the excess"}`)
	res.decode(t, &got)
	if res.status != http.StatusOK || got.Status != "refunded" {
		t.Fatalf("resolve once the payment is confirmed: %d %s, want 200 and the order refunded", res.status, res.body)
	}
}

// README: "On shutdown, waiting requests answer at once." Long-polls
// waiting on an unchanged order (with and without If-None-Match) answer
// within a second of the server's Drain (serve calls it when it starts
// shutting down): 304, or the unchanged order.
func TestLongPollsAnswerWithinASecondOfDrain(t *testing.T) {
	f := newLiveFixture(t, true)
	o, etag := f.create("ethereum", "USDT", "31")
	var waiting []<-chan answer
	for range 3 {
		waiting = append(waiting, f.poll(o.ID, "60s", etag))
	}
	bare := f.poll(o.ID, "60s", "")
	f.waitFor(5*time.Second, "four long-polls to wait", func() bool { return f.changes.active.Load() == 4 })
	drained := time.Now()
	f.api.Drain()
	for i, c := range waiting {
		a := f.answerOf(c, 5*time.Second, "a long-poll at shutdown")
		if took := a.at.Sub(drained); a.status != http.StatusNotModified || took > time.Second {
			t.Fatalf("long-poll %d answered %d %s after the drain began, want 304 within a second", i, a.status, took.Round(time.Millisecond))
		}
	}
	a := f.answerOf(bare, 5*time.Second, "a long-poll without If-None-Match at shutdown")
	if took := a.at.Sub(drained); a.status != http.StatusOK || a.etag != etag || took > time.Second {
		t.Fatalf("the long-poll without If-None-Match answered %d (ETag %s, want %s) %s after the drain began, want 200 with the unchanged order within a second",
			a.status, a.etag, etag, took.Round(time.Millisecond))
	}
	// A long-poll arriving during the shutdown does not wait either.
	start := time.Now()
	late := f.answerOf(f.poll(o.ID, "60s", etag), 5*time.Second, "a long-poll after the drain began")
	if took := time.Since(start); late.status != http.StatusNotModified || took > time.Second {
		t.Fatalf("a long-poll sent after the drain began answered %d after %s, want 304 at once", late.status, took.Round(time.Millisecond))
	}
}
