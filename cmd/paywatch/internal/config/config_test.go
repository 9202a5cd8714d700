package config

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
)

var env = map[string]string{
	"PAYWATCH_DATABASE_URL":   "postgres://postgres@127.0.0.1:5432/paywatch?sslmode=disable",
	"PAYWATCH_STOREFRONT_KEY": "sf_0123456789abcdef",
	"PAYWATCH_OPERATOR_KEY":   "op_0123456789abcdef",
	"PAYWATCH_WEBHOOK_SECRET": "whsec_0123456789",
	"PAYWATCH_BTC_RPC_USER":   "user",
	"PAYWATCH_BTC_RPC_PASS":   "pass",
}

func getenv(k string) string { return env[k] }

func TestExampleConfig(t *testing.T) {
	cfg, err := Load("../../paywatch.example.yaml", getenv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" || cfg.Orders.MonitoringWindow != 24*time.Hour || cfg.Orders.PaidGrace != 2*time.Hour {
		t.Fatalf("orders: %+v listen %s", cfg.Orders, cfg.Listen)
	}
	if len(cfg.APIKeys) != 2 || cfg.APIKeys[1].Role != RoleOperator || cfg.APIKeys[1].Key != env["PAYWATCH_OPERATOR_KEY"] {
		t.Fatalf("keys: %+v", cfg.APIKeys)
	}
	eth := cfg.Network("ethereum")
	if eth == nil || eth.Family != paywatch.FamilyEVM || eth.ChainID != 1337 || eth.Confirmations != 3 || eth.StartLatest {
		t.Fatalf("ethereum: %+v", eth)
	}
	// README: the example watches an EVM node at 127.0.0.1:8545 and a
	// Bitcoin regtest node at 127.0.0.1:18556.
	if got := strings.Join(eth.RPCURLs, " "); got != "http://127.0.0.1:8545" {
		t.Fatalf("ethereum node %q", got)
	}
	if b := cfg.Network("bitcoin"); b == nil || b.Chain != "regtest" || strings.Join(b.RPCURLs, " ") != "http://127.0.0.1:18556" {
		t.Fatalf("bitcoin: %+v", b)
	}
	usdt := eth.Asset("USDT")
	if usdt == nil || usdt.Decimals != 6 || usdt.UniqueStep.Int64() != 1 || usdt.UniqueSlots != 10000 || usdt.Mode != paywatch.ModeShared {
		t.Fatalf("USDT: %+v", usdt)
	}
	if ethAsset := eth.Asset("ETH"); ethAsset.UniqueStep.String() != "1000000000000" {
		t.Fatalf("ETH step %s", ethAsset.UniqueStep)
	}
	btc := cfg.Network("bitcoin").Asset("BTC")
	if btc.Mode != paywatch.ModePerOrder || btc.ScriptType != "p2wpkh" || cfg.Network("bitcoin").RPCUser != "user" {
		t.Fatalf("BTC: %+v", btc)
	}
}

const base = `
database_url_env: PAYWATCH_DATABASE_URL
api_keys:
  - {name: storefront, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}
networks:
  - name: ethereum
    family: evm
    rpc_urls: [http://127.0.0.1:8545]
    chain_id: 1337
    assets:
      - symbol: USDT
        contract: "0xdAC17F958D2ee523a2206206994597C13D831ec7"
        decimals: 6
        unique_step: "0.000001"
        receive: {addresses: ["0x1111111111111111111111111111111111111111"]}
`

func TestMinimalConfigDefaults(t *testing.T) {
	cfg, err := Parse([]byte(base), getenv)
	if err != nil {
		t.Fatal(err)
	}
	n := cfg.Networks[0]
	if cfg.Listen != DefaultListen || cfg.ReconcilerSchedule != DefaultSchedule || !n.StartLatest || n.Confirmations != 12 || n.PollInterval != 5*time.Second {
		t.Fatalf("defaults: %+v %+v", cfg, n)
	}
	if cfg.Orders.DefaultExpiry != time.Hour || cfg.WebhookURL != "" {
		t.Fatalf("orders %+v", cfg.Orders)
	}
	// README's configuration table, its defaults.
	if cfg.Orders.MaxExpiry != 168*time.Hour || cfg.Orders.MonitoringWindow != 24*time.Hour || cfg.Orders.PaidGrace != 2*time.Hour ||
		cfg.WebhookMaxRetryAge != 72*time.Hour {
		t.Fatalf("defaults: orders %+v, webhooks max_retry_age %s", cfg.Orders, cfg.WebhookMaxRetryAge)
	}
	// The API's pool: twice the cores, at least 4; as set when set.
	if want := max(4, 2*runtime.GOMAXPROCS(0)); cfg.DatabaseAPIConns != want || DefaultDatabaseAPIConns() != want {
		t.Fatalf("database_api_conns defaults to %d, want %d", cfg.DatabaseAPIConns, want)
	}
	if set, err := Parse([]byte(strings.Replace(base, "networks:", "database_api_conns: 3\nnetworks:", 1)), getenv); err != nil || set.DatabaseAPIConns != 3 {
		t.Fatalf("database_api_conns: 3 gave %v (%v)", set, err)
	}
	if usdt := n.Asset("USDT"); usdt.SkipBalanceCheck {
		t.Fatal("verify_balance defaults to false")
	}
	btcDoc := strings.Replace(base, "networks:\n", `networks:
  - name: btc
    family: bitcoin
    chain: regtest
    rpc_urls: [http://127.0.0.1:18443]
    rpc_user_env: PAYWATCH_STOREFRONT_KEY
    rpc_pass_env: PAYWATCH_STOREFRONT_KEY
    assets:
      - {symbol: BTC, native: true, decimals: 8, receive: {xpub: "vpub5SLqN2bLY4WeZF3kL4VqiWF1itbf3A6oRrq9aPf16AZMVWYCuN9TxpAZwCzVgW94TNzZPNc9XAHD4As6pdnExBtCDGYRmNJrcJ4eV9hNqcv"}}
`, 1)
	bcfg, err := Parse([]byte(btcDoc), getenv)
	if err != nil {
		t.Fatal(err)
	}
	btc := bcfg.Network("btc")
	if btc.Confirmations != 6 || btc.Asset("BTC").GapLimit != 20 || btc.Asset("BTC").Dust.Int64() != 546 {
		t.Fatalf("bitcoin defaults: confirmations %d, gap_limit %d, dust %v", btc.Confirmations, btc.Asset("BTC").GapLimit, btc.Asset("BTC").Dust)
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name     string
		old, new string // replace old with new in base
		unsetEnv string
		want     string
	}{
		{"unknown top key", "database_url_env:", "colour: blue\ndatabase_url_env:", "", "line 2: field colour not found"},
		{"unknown asset key", "decimals: 6", "decimals: 6\n        colour: blue", "", "field colour not found"},
		{"unknown family", "family: evm", "family: solana", "", `family "solana" is unknown`},
		{"duplicate network", "networks:\n", "networks:\n  - name: ethereum\n    family: evm\n    rpc_urls: [http://x:1]\n    chain_id: 1\n    assets: [{symbol: ETH, native: true, decimals: 18, unique_step: \"0.001\", receive: {addresses: [\"0x1111111111111111111111111111111111111111\"]}}]\n", "", `network name "ethereum" is used twice`},
		{"duplicate symbol", "      - symbol: USDT\n", "      - {symbol: USDT, native: true, decimals: 18, unique_step: \"0.001\", receive: {addresses: [\"0x1111111111111111111111111111111111111111\"]}}\n      - symbol: USDT\n", "", `asset symbol "USDT" is used twice`},
		{"bad checksum", "0xdAC17F958D2ee523a2206206994597C13D831ec7", "0xdAC17F958D2ee523a2206206994597C13D831Ec7", "", "wrong EIP-55 checksum"},
		{"malformed address", "0x1111111111111111111111111111111111111111", "0x11111", "", "malformed"},
		{"decimals out of range", "decimals: 6", "decimals: 40", "", "decimals 40 is out of range"},
		{"step finer than base unit", `unique_step: "0.000001"`, `unique_step: "0.0000001"`, "", "finer than the base unit"},
		{"step with exponent", `unique_step: "0.000001"`, `unique_step: "1e-6"`, "", "exponent"},
		{"env unset", "", "", "PAYWATCH_STOREFRONT_KEY", "names environment variable PAYWATCH_STOREFRONT_KEY, which is not set"},
		{"bad role", "role: storefront", "role: admin", "", `role "admin" is unknown`},
		{"bad confirmations", "chain_id: 1337", "chain_id: 1337\n    confirmations: many", "", "confirmations must be a number"},
		{"bad start block", "chain_id: 1337", "chain_id: 1337\n    start_block: -4", "", "start_block must be a block number"},
		{"bad schedule", "networks:", "reconciler: {schedule: \"every now and then\"}\nnetworks:", "", "schedule"},
		{"xpub on evm", `receive: {addresses: ["0x1111111111111111111111111111111111111111"]}`, `receive: {xpub: "xpub661MyMwAqRbcFtXgS5sYJABqqG9YLmC4Q1Rdap9gSE8NqtwybGhePY2gZ29ESFjqJoCu1Rupje8YtGqsefD265TMg7usUDFdp6W1EGMcet8"}`, "", "needs family bitcoin"},
		{"missing chain id", "chain_id: 1337", "", "", "chain_id is required"},
		{"no networks", base[strings.Index(base, "networks:"):], "networks: []\n", "", "at least one network is required"},
		{"missing decimals", "decimals: 6", "", "", "decimals is required"},
		{"token without contract", `contract: "0xdAC17F958D2ee523a2206206994597C13D831ec7"`, "", "", "a token needs its contract"},
		{"a name with format verbs", "      - symbol: USDT\n", "      - symbol: \"U%dS%sT\"\n", "", `"U%dS%sT" (line`},
		{"bad rpc url", "http://127.0.0.1:8545", "127.0.0.1:8545", "", "is not an http(s) URL"},
		{"network name with capitals", "name: ethereum", "name: Ethereum", "", "lowercase"},
		{"short api key", "key_env: PAYWATCH_STOREFRONT_KEY}", "key_env: PAYWATCH_BTC_RPC_USER}", "", "shorter than 16 characters"},
		{"two roles, one key", "key_env: PAYWATCH_STOREFRONT_KEY}", "key_env: PAYWATCH_STOREFRONT_KEY}\n  - {name: ops, role: operator, key_env: PAYWATCH_STOREFRONT_KEY}", "", "the same as another key's"},
		{"bitcoin without chain", "networks:\n", "networks:\n  - {name: btc, family: bitcoin, rpc_urls: [\"http://127.0.0.1:18443\"], assets: [{symbol: BTC, native: true, decimals: 8, receive: {addresses: [\"bcrt1qw508d6qejxtdg4y5r3zarvary0c5xw7kygt080\"]}}]}\n", "", "chain"},
		{"max_retry_age under a minute", "networks:", "webhooks: {max_retry_age: 30s}\nnetworks:", "", "max_retry_age 30s must be at least 1m"},
		{"negative api pool", "networks:", "database_api_conns: -1\nnetworks:", "", "database_api_conns -1 must be between 1 and 200"},
		{"api pool of none", "networks:", "database_api_conns: 0\nnetworks:", "", "database_api_conns 0 must be between 1 and 200"},
		{"api pool too large", "networks:", "database_api_conns: 201\nnetworks:", "", "database_api_conns 201 must be between 1 and 200"},
		{"api pool not a number", "networks:", "database_api_conns: many\nnetworks:", "", `line 5: "many" is not a whole number`},
		{"api pool a fraction", "networks:", "database_api_conns: 7.9\nnetworks:", "", `line 5: "7.9" is not a whole number`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := base
			if c.old != "" {
				if !strings.Contains(doc, c.old) {
					t.Fatalf("test bug: %q not in base", c.old)
				}
				doc = strings.Replace(doc, c.old, c.new, 1)
			}
			ge := func(k string) string {
				if k == c.unsetEnv {
					return ""
				}
				return env[k]
			}
			_, err := Parse([]byte(doc), ge)
			if err == nil {
				t.Fatalf("accepted:\n%s", doc)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestBitcoinXPubMustFitChain(t *testing.T) {
	doc := `
database_url_env: PAYWATCH_DATABASE_URL
api_keys: [{name: s, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}]
networks:
  - name: bitcoin
    family: bitcoin
    rpc_urls: [http://127.0.0.1:18556]
    chain: mainnet
    assets:
      - symbol: BTC
        native: true
        decimals: 8
        receive: {xpub: "vpub5Y6cjg78GGuNLsaPhmYsiw4gYX3HoQiRBiSwDaBXKUafCt9bNwWQiitDk5VZ5BVxYnQdwoTyXSs2JHRPAgjAvtbBrf8ZhDYe2jWAqvZVnsc"}
`
	_, err := Parse([]byte(doc), getenv)
	if err == nil || !strings.Contains(err.Error(), "does not fit chain") {
		t.Fatalf("err = %v", err)
	}
	if _, err := Parse([]byte(strings.Replace(doc, "mainnet", "regtest", 1)), getenv); err != nil {
		t.Fatal(err)
	}
}

func TestAllProblemsReportedAtOnce(t *testing.T) {
	doc := strings.Replace(base, "decimals: 6", "decimals: 99", 1)
	doc = strings.Replace(doc, "family: evm", "family: evm\n    poll_interval: 1ms", 1)
	_, err := Parse([]byte(doc), func(string) string { return "" })
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"PAYWATCH_DATABASE_URL", "PAYWATCH_STOREFRONT_KEY", "decimals 99", "poll_interval"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
