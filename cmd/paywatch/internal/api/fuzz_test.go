package api

import (
	"testing"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
)

const fuzzConfig = `
database_url_env: DB
api_keys: [{name: shop, role: storefront, key_env: KEY}]
networks:
  - name: ethereum
    family: evm
    rpc_urls: [http://127.0.0.1:1]
    chain_id: 1
    assets:
      - {symbol: USDT, contract: "0xdAC17F958D2ee523a2206206994597C13D831ec7", decimals: 6, unique_step: "0.000001",
         receive: {addresses: ["0x1111111111111111111111111111111111111111"]}}
`

// FuzzCreateOrderBody feeds arbitrary bodies to the create decoder and
// validator: they must never panic, and every rejection carries an API code.
func FuzzCreateOrderBody(f *testing.F) {
	cfg, err := config.Parse([]byte(fuzzConfig), func(string) string { return "k_0123456789abcdef" })
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{cfg: cfg}
	for _, seed := range []string{
		`{"external_id":"a","network":"ethereum","asset":"USDT","amount":"1.5"}`,
		`{"external_id":"a","network":"ethereum","asset":"USDT","amount":1.5}`,
		`{"external_id":"a","network":"ethereum","asset":"USDT","amount":"1e5","metadata":{"a":[1,2]}}`,
		`{"amount":"-0"}`, `[]`, `null`, `{"expires_in_seconds":-1}`, `{"x":1}`, `{"amount":"٣"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var b createOrderRequest
		err := decodeJSON(body, &b)
		if err == nil {
			var req any
			req, err = s.createRequest(&b)
			if err == nil && req == nil {
				t.Fatal("accepted without a request")
			}
		}
		if err != nil && paywatch.ErrorCode(err) == paywatch.CodeInternal {
			t.Fatalf("body %q gave an error without an API code: %v", body, err)
		}
	})
}
