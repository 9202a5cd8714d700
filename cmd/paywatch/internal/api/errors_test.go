package api_test

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
)

// Every documented error, each answered in the error format and writing
// nothing.
func TestErrorResponses(t *testing.T) {
	f := newFixture(t)
	var existing orderJSON
	f.do("POST", "/v1/orders", storefrontKey, createBody).decode(t, &existing)
	var settled orderJSON // ONE has a single unique slot: this order takes it
	f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"one-1","network":"ethereum","asset":"ONE","amount":"5"}`).decode(t, &settled)
	var cancelled orderJSON
	f.do("POST", "/v1/orders", storefrontKey, `{"external_id":"c-1","network":"ethereum","asset":"USDT","amount":"5"}`).decode(t, &cancelled)
	f.do("POST", "/v1/orders/"+cancelled.ID+"/cancel", storefrontKey, "")

	order := func(network, asset, amount string) string {
		return `{"external_id":"new-1","network":"` + network + `","asset":"` + asset + `","amount":` + amount + `}`
	}
	cases := []struct {
		name         string
		method, path string
		key, body    string
		headers      []string
		status       int
		code, msg    string
	}{
		{"no key", "POST", "/v1/orders", "", order("ethereum", "USDT", `"1"`), nil, 401, "unauthorized", "missing API key"},
		{"unknown key", "POST", "/v1/orders", "sf_wrong_0123456789abcdef", order("ethereum", "USDT", `"1"`), nil, 401, "unauthorized", "unknown API key"},
		{"basic auth", "GET", "/v1/orders", "", "", []string{"Authorization", "Basic dXNlcjpwYXNz"}, 401, "unauthorized", ""},
		{"storefront on operator endpoint", "GET", "/v1/transfers", storefrontKey, "", nil, 403, "forbidden", "needs operator"},
		{"storefront on timeline", "GET", "/v1/orders/" + existing.ID + "/events", storefrontKey, "", nil, 403, "forbidden", ""},
		{"malformed JSON", "POST", "/v1/orders", storefrontKey, `{"external_id": "x",`, nil, 400, "invalid_request", "malformed JSON"},
		{"unknown field", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1","colour":"red"}`, nil, 400, "invalid_request", `unknown field "colour"`},
		{"trailing data", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `"1"`) + `{}`, nil, 400, "invalid_request", "nothing after it"},
		{"array body", "POST", "/v1/orders", storefrontKey, `[1,2]`, nil, 400, "invalid_request", "JSON object"},
		{"empty body", "POST", "/v1/orders", storefrontKey, ``, nil, 400, "invalid_request", "body is required"},
		{"wrong type", "POST", "/v1/orders", storefrontKey, `{"external_id":7}`, nil, 400, "invalid_request", "external_id must be a string"},
		{"missing external_id", "POST", "/v1/orders", storefrontKey, `{"network":"ethereum","asset":"USDT","amount":"1"}`, nil, 400, "invalid_request", "external_id is required"},
		{"control char in external_id", "POST", "/v1/orders", storefrontKey, `{"external_id":"a\u0000b","network":"ethereum","asset":"USDT","amount":"1"}`, nil, 400, "invalid_request", "external_id"},
		{"too many decimals", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `"1.0000001"`), nil, 400, "invalid_amount", "amount has 7 decimals; USDT allows 6"},
		{"negative", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `"-1"`), nil, 400, "invalid_amount", "negative"},
		{"zero", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `"0"`), nil, 400, "invalid_amount", "greater than zero"},
		{"exponent", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `"1e3"`), nil, 400, "invalid_amount", "exponent"},
		{"huge", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `"99999999999999999999"`), nil, 400, "invalid_amount", "exceeds the maximum of 1000000 USDT"},
		{"JSON number", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `12.5`), nil, 400, "invalid_amount", "decimal string"},
		{"NaN", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `"NaN"`), nil, 400, "invalid_amount", ""},
		{"missing amount", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT"}`, nil, 400, "invalid_amount", "amount is required"},
		{"unknown network", "POST", "/v1/orders", storefrontKey, order("solana", "USDT", `"1"`), nil, 400, "unknown_network", "solana"},
		{"unknown asset", "POST", "/v1/orders", storefrontKey, order("ethereum", "DOGE", `"1"`), nil, 400, "unknown_asset", "DOGE"},
		{"asset of another network", "POST", "/v1/orders", storefrontKey, order("bitcoin", "USDT", `"1"`), nil, 400, "unknown_asset", ""},
		{"expiry too short", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1","expires_in_seconds":5}`, nil, 400, "invalid_request", "expires_in_seconds"},
		{"expiry too long", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1","expires_in_seconds":99999999999}`, nil, 400, "invalid_request", "expires_in_seconds"},
		{"expiry of max_expiry (168 h by default)", "POST", "/v1/orders", storefrontKey, `{"external_id":"max-expiry","network":"ethereum","asset":"USDT","amount":"1","expires_in_seconds":604800}`, nil, 0, "", ""},
		{"expiry a second past max_expiry", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1","expires_in_seconds":604801}`, nil, 400, "invalid_request", "expires_in_seconds"},
		{"metadata not an object", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1","metadata":[1]}`, nil, 400, "invalid_request", "metadata must be a JSON object"},
		{"conflicting external_id", "POST", "/v1/orders", storefrontKey, strings.Replace(createBody, "1234.00", "1235", 1), nil, 409, "conflict", "external_id"},
		{"reused idempotency key", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `"1"`), []string{"Idempotency-Key", "idem-x"}, 0, "", ""},
		{"reused idempotency key, other body", "POST", "/v1/orders", storefrontKey, order("ethereum", "USDT", `"2"`), []string{"Idempotency-Key", "idem-x"}, 409, "conflict", "Idempotency-Key"},
		{"no unique amount", "POST", "/v1/orders", storefrontKey, `{"external_id":"one-2","network":"ethereum","asset":"ONE","amount":"5"}`, nil, 409, "no_unique_amount", "unique pay amounts"},
		{"order not found", "GET", "/v1/orders/ord_doesnotexist", storefrontKey, "", nil, 404, "not_found", ""},
		{"order id of odd shape", "GET", "/v1/orders/%27%3B%20DROP%20TABLE%20orders", storefrontKey, "", nil, 404, "not_found", ""},
		{"paid on missing order", "POST", "/v1/orders/ord_nope/paid", storefrontKey, "", nil, 404, "not_found", ""},
		{"bad tx hash (evm)", "POST", "/v1/orders/" + existing.ID + "/paid", storefrontKey, `{"tx_hash":"0x1234"}`, nil, 400, "invalid_request", "EVM transaction hash"},
		{"bitcoin-style hash on evm", "POST", "/v1/orders/" + existing.ID + "/paid", storefrontKey, `{"tx_hash":"` + strings.Repeat("ab", 32) + `"}`, nil, 400, "invalid_request", "tx_hash"},
		{"unknown field on paid", "POST", "/v1/orders/" + existing.ID + "/paid", storefrontKey, `{"txhash":"0x"}`, nil, 400, "invalid_request", "unknown field"},
		{"paid on cancelled", "POST", "/v1/orders/" + cancelled.ID + "/paid", storefrontKey, "", nil, 409, "invalid_state", "cancelled"},
		{"cancel twice", "POST", "/v1/orders/" + cancelled.ID + "/cancel", storefrontKey, "", nil, 409, "invalid_state", ""},
		{"transfer not found", "GET", "/v1/transfers/trf_nope", operatorKey, "", nil, 404, "not_found", ""},
		{"bad limit", "GET", "/v1/orders?limit=0", storefrontKey, "", nil, 400, "invalid_request", "limit"},
		{"limit too big", "GET", "/v1/orders?limit=501", storefrontKey, "", nil, 400, "invalid_request", "limit"},
		{"unknown query parameter", "GET", "/v1/orders?colour=red", storefrontKey, "", nil, 400, "invalid_request", "unknown query parameter"},
		{"bad status filter", "GET", "/v1/orders?status=paid", storefrontKey, "", nil, 400, "invalid_request", "status"},
		{"unknown network filter", "GET", "/v1/orders?network=solana", storefrontKey, "", nil, 400, "unknown_network", ""},
		{"bad cursor", "GET", "/v1/orders?cursor=abc", storefrontKey, "", nil, 400, "invalid_request", "cursor"},
		{"bad matched filter", "GET", "/v1/transfers?matched=maybe", operatorKey, "", nil, 400, "invalid_request", "matched"},
		{"bad state filter", "GET", "/v1/transfers?state=lost", operatorKey, "", nil, 400, "invalid_request", "state"},
		{"too large", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","metadata":{"pad":"` + strings.Repeat("x", 70<<10) + `"}}`, nil, 413, "payload_too_large", "over 65536 bytes"},
		{"attach by a storefront", "POST", "/v1/transfers/trf_x/attach", storefrontKey, `{"order_id":"` + existing.ID + `","note":"n"}`, nil, 403, "forbidden", ""},
		{"attach unknown transfer", "POST", "/v1/transfers/trf_x/attach", operatorKey, `{"order_id":"` + existing.ID + `","note":"n"}`, nil, 404, "not_found", "trf_x"},
		{"attach without order", "POST", "/v1/transfers/trf_x/attach", operatorKey, `{"note":"n"}`, nil, 400, "invalid_request", "order_id"},
		{"attach unknown field", "POST", "/v1/transfers/trf_x/attach", operatorKey, `{"order":"x"}`, nil, 400, "invalid_request", "unknown field"},
		{"resolve without note", "POST", "/v1/orders/" + existing.ID + "/resolve", operatorKey, `{"outcome":"settled"}`, nil, 400, "invalid_request", "note is required"},
		{"resolve bad outcome", "POST", "/v1/orders/" + existing.ID + "/resolve", operatorKey, `{"outcome":"paid","note":"x"}`, nil, 400, "invalid_request", "outcome"},
		{"resolve an undisputed order", "POST", "/v1/orders/" + existing.ID + "/resolve", operatorKey, `{"outcome":"settled","note":"x"}`, nil, 409, "invalid_state", "only disputed"},
		{"resolve by a storefront", "POST", "/v1/orders/" + existing.ID + "/resolve", storefrontKey, `{"outcome":"settled","note":"x"}`, nil, 403, "forbidden", ""},
		{"balances by a storefront", "GET", "/v1/ledger/balances", storefrontKey, "", nil, 403, "forbidden", ""},
		{"balances unknown parameter", "GET", "/v1/ledger/balances?prefix=x", operatorKey, "", nil, 400, "invalid_request", "unknown query parameter"},
		{"id with invalid UTF-8", "GET", "/v1/orders/%ff", storefrontKey, "", nil, 404, "not_found", ""},
		{"id with a NUL byte", "GET", "/v1/orders/%00", storefrontKey, "", nil, 404, "not_found", ""},
		{"paid on an id with invalid UTF-8", "POST", "/v1/orders/ord_%ff/paid", storefrontKey, "", nil, 404, "not_found", ""},
		{"cancel an id with a NUL byte", "POST", "/v1/orders/ord_%00/cancel", storefrontKey, "", nil, 404, "not_found", ""},
		{"timeline of an id with a NUL byte", "GET", "/v1/orders/%00/events", operatorKey, "", nil, 404, "not_found", ""},
		{"transfer id with invalid UTF-8", "GET", "/v1/transfers/trf_%c3%28", operatorKey, "", nil, 404, "not_found", ""},
		{"attach a transfer id with a NUL byte", "POST", "/v1/transfers/trf_%00/attach", operatorKey, `{"order_id":"` + existing.ID + `","note":"n"}`, nil, 404, "not_found", ""},
		{"attach to an order id with a NUL byte", "POST", "/v1/transfers/trf_x/attach", operatorKey, `{"order_id":"ord_\u0000","note":"n"}`, nil, 400, "invalid_request", "NUL"},
		{"resolve an id with invalid UTF-8", "POST", "/v1/orders/%ff/resolve", operatorKey, `{"outcome":"settled","note":"x"}`, nil, 404, "not_found", ""},
		{"resolve with a NUL in the note", "POST", "/v1/orders/" + existing.ID + "/resolve", operatorKey, `{"outcome":"settled","note":"a\u0000b"}`, nil, 400, "invalid_request", "NUL"},
		{"metadata with a NUL", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1","metadata":{"plan":"a\u0000"}}`, nil, 400, "invalid_request", "metadata.plan"},
		{"cursor with invalid UTF-8", "GET", "/v1/orders?cursor=" + badCursor("\xff"), storefrontKey, "", nil, 400, "invalid_request", "cursor"},
		{"cursor with a NUL byte", "GET", "/v1/transfers?cursor=" + badCursor("\x00"), operatorKey, "", nil, 400, "invalid_request", "cursor"},
		{"external_id filter with invalid UTF-8", "GET", "/v1/orders?external_id=%ff", storefrontKey, "", nil, 400, "invalid_request", "external_id"},
		{"asset filter with a NUL byte", "GET", "/v1/transfers?asset=%00", operatorKey, "", nil, 400, "invalid_request", "asset"},
		{"expiry overflowing a duration", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1","expires_in_seconds":9223372037}`, nil, 400, "invalid_request", "expires_in_seconds"},
		{"expiry of the largest integer", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1","expires_in_seconds":9223372036854775807}`, nil, 400, "invalid_request", "expires_in_seconds"},
		{"negative expiry", "POST", "/v1/orders", storefrontKey, `{"external_id":"x","network":"ethereum","asset":"USDT","amount":"1","expires_in_seconds":-9223372036854775808}`, nil, 400, "invalid_request", "expires_in_seconds"},
		{"unknown endpoint", "GET", "/v2/orders", storefrontKey, "", nil, 404, "not_found", ""},
		{"wrong method", "PUT", "/v1/orders/" + existing.ID, storefrontKey, "", nil, 405, "invalid_request", "not allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := f.rows()
			res := f.do(c.method, c.path, c.key, c.body, c.headers...)
			if c.status == 0 { // a setup step
				if res.status >= 300 {
					t.Fatalf("setup: %d %s", res.status, res.body)
				}
				return
			}
			if res.status != c.status || res.code() != c.code {
				t.Fatalf("got %d %s, want %d %s", res.status, res.body, c.status, c.code)
			}
			if !strings.Contains(res.message(), c.msg) {
				t.Fatalf("message %s does not mention %q", res.body, c.msg)
			}
			if ct := res.header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("content type %q", ct)
			}
			if c.status == http.StatusUnauthorized && res.header.Get("WWW-Authenticate") == "" {
				t.Fatal("401 without WWW-Authenticate")
			}
			if after := f.rows(); after != before {
				t.Fatalf("a rejected request wrote rows: %v → %v", before, after)
			}
		})
	}
}

// badCursor is a well-formed cursor whose id holds raw bytes.
func badCursor(raw string) string {
	return base64.RawURLEncoding.EncodeToString([]byte("1700000000000000|ord_" + raw))
}

// A failing database answers 500 internal without leaking details.
func TestInternalErrorHidesDetails(t *testing.T) {
	f := newFixture(t)
	f.db.Close()
	res := f.do("GET", "/v1/orders/ord_x", storefrontKey, "")
	// Exactly the generic answer: nothing of the driver's error (which
	// names the database, the connection, the query) reaches the caller.
	if res.status != 500 || strings.TrimSpace(string(res.body)) != `{"error":{"code":"internal","message":"internal error"}}` {
		t.Fatalf("%d %s", res.status, res.body)
	}
	if res := f.do("GET", "/readyz", "", ""); res.status != 503 {
		t.Fatalf("readyz with a closed database: %d", res.status)
	}
}
