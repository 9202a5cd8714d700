package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
)

type gapJSON struct {
	Asset         string `json:"asset"`
	Given         int64  `json:"addresses_given"`
	LastPaid      *int64 `json:"last_paid_index"`
	Unpaid        int64  `json:"unpaid_run"`
	UnpaidAtLeast *bool  `json:"unpaid_run_at_least"`
	GapLimit      int    `json:"gap_limit"`
	OverGapLimit  bool   `json:"over_gap_limit"`
}

// gap reads the bitcoin key's addresses from GET /v1/networks.
func (f *fixture) gap() gapJSON {
	f.t.Helper()
	var list struct {
		Data []struct {
			Name      string    `json:"name"`
			Addresses []gapJSON `json:"addresses"`
		} `json:"data"`
	}
	res := f.do("GET", "/v1/networks", operatorKey, "")
	res.decode(f.t, &list)
	for _, n := range list.Data {
		if n.Name == "bitcoin" && len(n.Addresses) == 1 {
			return n.Addresses[0]
		}
	}
	f.t.Fatalf("no addresses for bitcoin's key in GET /v1/networks: %d %s", res.status, res.body)
	return gapJSON{}
}

// README ("HTTP API"): a network's `addresses` in GET /v1/networks carry
// "`unpaid_run_at_least: true` when more than 100,000 addresses were handed
// out and none of the last 100,000 was paid". A run of 100,000 with nothing
// paid, and one of 99,999 after a paid address, are told exactly (no
// flag); runs of 100,001 are reported as at least 100,000, with no last
// paid index.
func TestNetworksUnpaidRunAtLeastBeyond100000Addresses(t *testing.T) {
	if orders.MaxGapWalk != 100_000 {
		t.Fatalf("the walk back covers %d addresses, README says 100,000", orders.MaxGapWalk)
	}
	f := newFixture(t)
	// Six orders take addresses 0 to 5; the last one is paid.
	var last orderJSON
	for i := range 6 {
		res := f.do("POST", "/v1/orders", storefrontKey, fmt.Sprintf(`{"external_id":"gap-%d","network":"bitcoin","asset":"BTC","amount":"0.001"}`, i))
		if res.status != http.StatusCreated {
			t.Fatalf("create: %d %s", res.status, res.body)
		}
		res.decode(t, &last)
	}
	// handedOut sets how many addresses were handed out, as that many
	// orders would have.
	handedOut := func(n int64) {
		pgtest.Exec(t, f.db, `UPDATE derivation_counters SET next_index = $1 WHERE derivation_key = $2`, n, vpub)
	}
	check := func(what string, given, unpaid int64, lastPaid *int64, atLeast bool) {
		t.Helper()
		g := f.gap()
		flag := g.UnpaidAtLeast != nil && *g.UnpaidAtLeast
		if g.Given != given || g.Unpaid != unpaid || flag != atLeast || (g.LastPaid == nil) != (lastPaid == nil) ||
			(lastPaid != nil && *g.LastPaid != *lastPaid) || !g.OverGapLimit || g.GapLimit != 20 {
			raw, _ := json.Marshal(g)
			t.Fatalf("%s: addresses %s, want addresses_given %d, unpaid_run %d, last_paid_index %v, unpaid_run_at_least %v, over_gap_limit",
				what, raw, given, unpaid, ptrText(lastPaid), atLeast)
		}
	}

	// Nothing paid: the run is every address handed out, told exactly up to
	// the bound.
	handedOut(100_000)
	check("100,000 addresses, none paid", 100_000, 100_000, nil, false)
	handedOut(100_001)
	check("100,001 addresses, none paid", 100_001, 100_000, nil, true)

	// Address 5 paid.
	pgtest.Exec(t, f.db, `INSERT INTO transfers (id, network, asset, tx_hash, tx_key, idx, to_address,
		amount, block_number, block_hash, state, first_seen_at, updated_at)
		VALUES ('trf_gap', 'bitcoin', 'BTC', 'txgap', 'vout:0', 0, $1, 100000, 3, '0xb3', 'confirmed', now(), now())`, last.PayAddress)
	five := int64(5)
	handedOut(100_005)
	check("99,999 unpaid after the paid address 5", 100_005, 99_999, &five, false)
	handedOut(100_007)
	check("100,001 unpaid after the paid address 5", 100_007, 100_000, nil, true)
}

func ptrText(p *int64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}
