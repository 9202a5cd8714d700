package config

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcutil/hdkeychain"
	"github.com/btcsuite/btcd/chaincfg"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
)

// parseWith parses base with old replaced by new (old must be in base).
func parseWith(t *testing.T, old, new string) (*Config, error) {
	t.Helper()
	if !strings.Contains(base, old) {
		t.Fatalf("test bug: %q not in the base configuration", old)
	}
	return Parse([]byte(strings.Replace(base, old, new, 1)), getenv)
}

// README ("Configuration"): "`listen` | `127.0.0.1:8080`",
// "`reconciler.schedule` | `@every 15s`", "`orders.default_expiry` | `1h`",
// "`webhooks.allow_private_networks` | `false`", "`assets[].max_amount` |
// 10^76 − 1 base units", "`assets[].dust` | 0; 546 sat for Bitcoin". A
// configuration that leaves these keys out gets exactly the values the
// table gives (written out here, not taken from the package's constants).
func TestConfigDefaultsAreTheREADMEValues(t *testing.T) {
	doc := strings.Replace(base, "      - symbol: USDT\n",
		"      - {symbol: ETH, native: true, decimals: 18, unique_step: \"0.000001\", receive: {addresses: [\"0x1111111111111111111111111111111111111111\"]}}\n      - symbol: USDT\n", 1)
	cfg, err := Parse([]byte(doc), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8080" {
		t.Errorf("listen defaults to %q, README says 127.0.0.1:8080", cfg.Listen)
	}
	if cfg.ReconcilerSchedule != "@every 15s" {
		t.Errorf("reconciler.schedule defaults to %q, README says @every 15s", cfg.ReconcilerSchedule)
	}
	if cfg.Orders.DefaultExpiry != 60*time.Minute {
		t.Errorf("orders.default_expiry defaults to %s, README says 1h", cfg.Orders.DefaultExpiry)
	}
	if cfg.WebhookAllowPrivate {
		t.Error("webhooks.allow_private_networks defaults to true, README says false")
	}
	// Said explicitly, it is taken.
	if c, err := parseWith(t, "networks:", "webhooks: {allow_private_networks: true}\nnetworks:"); err != nil || !c.WebhookAllowPrivate {
		t.Errorf("webhooks.allow_private_networks: true is not taken (%v)", err)
	}

	// Dust: 0 on an EVM network, for the native coin and a token alike.
	eth := cfg.Network("ethereum")
	for _, sym := range []string{"ETH", "USDT"} {
		a := eth.Asset(sym)
		if a.Dust == nil || a.Dust.Sign() != 0 {
			t.Errorf("%s on an EVM network: dust defaults to %v base units, README says 0", sym, a.Dust)
		}
	}

	// max_amount: 10^76 − 1 base units is accepted, 10^76 is not; the same
	// for an asset with decimals (USDT: 6) and one without (decimals 0).
	nines := strings.Repeat("9", 76)
	usdt := eth.Asset("USDT")
	if _, err := usdt.ParseAmount(nines[:70] + "." + nines[70:]); err != nil {
		t.Errorf("USDT: 10^76 − 1 base units (%s.%s) refused by default: %v", nines[:70], nines[70:], err)
	}
	if _, err := usdt.ParseAmount("1" + strings.Repeat("0", 70)); err == nil || !strings.Contains(paywatch.ErrorMessage(err), "exceeds the maximum of "+nines[:70]+"."+nines[70:]+" USDT") {
		t.Errorf("USDT: 10^76 base units accepted by default, or refused without saying the maximum: %v", err)
	}
	c0, err := parseWith(t, "decimals: 6\n        unique_step: \"0.000001\"", "decimals: 0\n        unique_step: \"1\"")
	if err != nil {
		t.Fatal(err)
	}
	whole := c0.Network("ethereum").Asset("USDT")
	if _, err := whole.ParseAmount(nines); err != nil {
		t.Errorf("decimals 0: 10^76 − 1 refused by default: %v", err)
	}
	if _, err := whole.ParseAmount("1" + strings.Repeat("0", 76)); err == nil {
		t.Error("decimals 0: 10^76 accepted by default")
	}
}

// README ("Configuration"): "`database_url_env` | required", "`api_keys[]`
// | one required", "`networks[].rpc_urls` | required", "`assets[].unique_step`
// | required with addresses". Each one left out is refused, with a message
// that names the key and where it is missing.
func TestConfigRefusesMissingRequiredKeys(t *testing.T) {
	for _, c := range []struct {
		name, old, new, want string
	}{
		{"database_url_env", "database_url_env: PAYWATCH_DATABASE_URL\n", "", "database_url_env is required"},
		{"api_keys left out", "api_keys:\n  - {name: storefront, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}\n", "",
			"api_keys: at least one key is required"},
		{"api_keys empty", "api_keys:\n  - {name: storefront, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}\n", "api_keys: []\n",
			"api_keys: at least one key is required"},
		{"rpc_urls left out", "    rpc_urls: [http://127.0.0.1:8545]\n", "",
			`networks[0] "ethereum" (line 6): rpc_urls needs at least one URL`},
		{"rpc_urls empty", "rpc_urls: [http://127.0.0.1:8545]", "rpc_urls: []",
			`networks[0] "ethereum" (line 6): rpc_urls needs at least one URL`},
		{"unique_step with addresses", "        unique_step: \"0.000001\"\n", "",
			`networks[0] "ethereum" (line 6) assets[0] "USDT" (line 11): unique_step is required with shared receive addresses`},
		{"network name", "  - name: ethereum\n    family: evm", "  - family: evm",
			"networks[0] (line 6): name is required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseWith(t, c.old, c.new)
			if err == nil {
				t.Fatalf("a configuration without %s is accepted", c.name)
			}
			if err.Error() != c.want {
				t.Fatalf("without %s the error is\n  %q\nwant exactly\n  %q", c.name, err, c.want)
			}
		})
	}
}

// README ("Configuration"): "`networks[].chain` | required for `bitcoin` |
// `mainnet`, `testnet`, `signet`, `regtest`, `simnet`" and
// "`assets[].receive.xpub` | an address per order, derived from an account
// xpub/ypub/zpub (mainnet) or tpub/upub/vpub (test chains)". Each chain is
// accepted and its addresses are that chain's (BIP84 test vector); a ypub
// is accepted on mainnet and gives BIP49 addresses (p2sh-p2wpkh, the
// published first address of the test mnemonic), and is refused on a test
// chain; an unknown chain is refused.
func TestBitcoinChainsAndYpubAccepted(t *testing.T) {
	const (
		// m/84'/1'/0' and m/49'/0'/0' of the BIP39 test mnemonic
		// ("abandon" × 11, "about").
		vpub = "vpub5Y6cjg78GGuNLsaPhmYsiw4gYX3HoQiRBiSwDaBXKUafCt9bNwWQiitDk5VZ5BVxYnQdwoTyXSs2JHRPAgjAvtbBrf8ZhDYe2jWAqvZVnsc"
		ypub = "ypub6Ww3ibxVfGzLrAH1PNcjyAWenMTbbAosGNB6VvmSEgytSER9azLDWCxoJwW7Ke7icmizBMXrzBx9979FfaHxHcrArf3zbeJJJUZPf663zsP"
		zpub = "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs"
	)
	doc := func(chain, key string) string {
		return `
database_url_env: PAYWATCH_DATABASE_URL
api_keys: [{name: s, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}]
networks:
  - name: btc
    family: bitcoin
    rpc_urls: [http://127.0.0.1:18443]
    chain: ` + chain + `
    assets:
      - {symbol: BTC, native: true, decimals: 8, receive: {xpub: "` + key + `"}}
`
	}
	for _, c := range []struct {
		chain, key, script, first string
	}{
		{"mainnet", zpub, "p2wpkh", "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu"},
		{"mainnet", ypub, "p2sh-p2wpkh", "37VucYSaXLCAsxYyAPfbSi9eh4iEcbShgf"},
		{"testnet", vpub, "p2wpkh", "tb1q6rz28mcfaxtmd6v789l9rrlrusdprr9pqcpvkl"},
		{"signet", vpub, "p2wpkh", "tb1q6rz28mcfaxtmd6v789l9rrlrusdprr9pqcpvkl"},
		{"regtest", vpub, "p2wpkh", "bcrt1q6rz28mcfaxtmd6v789l9rrlrusdprr9pz3cppk"},
		{"simnet", vpub, "p2wpkh", "sb1q6rz28mcfaxtmd6v789l9rrlrusdprr9p9l2fkq"},
	} {
		cfg, err := Parse([]byte(doc(c.chain, c.key)), getenv)
		if err != nil {
			t.Errorf("chain %s with a %s: refused: %v", c.chain, c.key[:4], err)
			continue
		}
		n := cfg.Network("btc")
		a := n.Asset("BTC")
		if n.Chain != c.chain || a.Mode != paywatch.ModePerOrder || a.ScriptType != c.script {
			t.Errorf("chain %s with a %s: chain %q, mode %v, script type %q; want %s, per order, %s",
				c.chain, c.key[:4], n.Chain, a.Mode, a.ScriptType, c.chain, c.script)
			continue
		}
		w, err := bitcoin.NewWallets(cfg.Networks)
		if err != nil {
			t.Fatal(err)
		}
		d := w[a.XPub]
		if d == nil {
			t.Fatalf("chain %s: no deriver for the configured key", c.chain)
		}
		if got, err := d.Address(0); err != nil || got != c.first {
			t.Errorf("chain %s with a %s: the first order's address is %s (%v), want %s", c.chain, c.key[:4], got, err, c.first)
		}
	}
	if _, err := Parse([]byte(doc("testnet", ypub)), getenv); err == nil || !strings.Contains(err.Error(), "is a ypub, which does not fit chain \"testnet\"") {
		t.Errorf("a ypub on testnet: %v, want it refused as a mainnet key", err)
	}
	if _, err := Parse([]byte(doc("testnet4", vpub)), getenv); err == nil ||
		!strings.Contains(err.Error(), `unknown bitcoin chain "testnet4" (want mainnet, testnet, signet, regtest or simnet)`) {
		t.Errorf("chain testnet4: %v, want it refused, naming the chains accepted", err)
	}
}

// README ("Configuration"): "`assets[].decimals` | required | 0 to 36".
// Both ends are accepted (with a unique_step of one base unit), one past
// either end is refused with the range in the message.
func TestAssetDecimalsFrom0To36(t *testing.T) {
	step := func(decimals int) string {
		if decimals == 0 {
			return "1"
		}
		return "0." + strings.Repeat("0", decimals-1) + "1"
	}
	for _, d := range []int{0, 36} {
		cfg, err := parseWith(t, "decimals: 6\n        unique_step: \"0.000001\"",
			"decimals: "+strconv.Itoa(d)+"\n        unique_step: \""+step(d)+"\"")
		if err != nil {
			t.Errorf("decimals %d refused: %v", d, err)
			continue
		}
		a := cfg.Network("ethereum").Asset("USDT")
		if a.Decimals != int32(d) || a.UniqueStep.Int64() != 1 {
			t.Errorf("decimals %d: the asset has %d decimals and a step of %v base units", d, a.Decimals, a.UniqueStep)
		}
	}
	for _, d := range []int{-1, 37} {
		_, err := parseWith(t, "decimals: 6\n        unique_step: \"0.000001\"", "decimals: "+strconv.Itoa(d))
		if err == nil || !strings.Contains(err.Error(), "decimals "+strconv.Itoa(d)+" is out of range (0 to 36)") {
			t.Errorf("decimals %d: %v, want it refused as out of range (0 to 36)", d, err)
		}
	}
}

// README ("Configuration"): "`networks[].name` | required | lowercase
// letters, digits, dashes; unique". A name of one character and one of 63
// (lowercase letters, digits and dashes, starting with a letter or a
// digit) are accepted; capitals, an underscore, a dot, a space, a leading
// dash and 64 characters are refused, with a message that gives the rule.
func TestNetworkNameRule(t *testing.T) {
	long := "a" + strings.Repeat("-0", 31) // 63 characters
	for _, name := range []string{"a", "7", "base-sepolia", "0-x", long} {
		cfg, err := parseWith(t, "name: ethereum", "name: \""+name+"\"")
		if err != nil || cfg.Network(name) == nil {
			t.Errorf("network name %q (%d characters) refused: %v", name, len(name), err)
		}
	}
	for _, name := range []string{"Ethereum", "eth_main", "eth.main", "eth main", "-eth", long + "x", "ethé"} {
		_, err := parseWith(t, "name: ethereum", "name: \""+name+"\"")
		if err == nil {
			t.Errorf("network name %q accepted", name)
			continue
		}
		want := "name " + strconv.Quote(name) + " must be lowercase letters, digits and dashes (at most 63 characters, not starting with a dash)"
		if !strings.Contains(err.Error(), want) {
			t.Errorf("network name %q: the error is %q, want it to say %q", name, err, want)
		}
	}
}

// README: "`assets[].receive.script_type` | from the prefix | `p2pkh`
// (BIP44), `p2sh-p2wpkh` (BIP49), `p2wpkh` (BIP84), `p2tr` (BIP86, from an
// xpub/tpub)". The prefix gives the script type (an xpub p2pkh, a zpub
// p2wpkh); script_type may say otherwise for an xpub (p2tr, or a segwit
// account exported as an xpub), never against a ypub's or zpub's; and it
// goes with an extended key only.
func TestReceiveScriptTypeFromThePrefixOrSaid(t *testing.T) {
	master, err := hdkeychain.NewMaster(bytes.Repeat([]byte{7}, 32), &chaincfg.MainNetParams)
	if err != nil {
		t.Fatal(err)
	}
	account, err := master.Neuter()
	if err != nil {
		t.Fatal(err)
	}
	xpub := account.String()
	const zpub = "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs"
	doc := func(receive string) string {
		return `
database_url_env: PAYWATCH_DATABASE_URL
api_keys: [{name: s, role: storefront, key_env: PAYWATCH_STOREFRONT_KEY}]
networks:
  - name: btc
    family: bitcoin
    rpc_urls: [http://127.0.0.1:8332]
    chain: mainnet
    assets:
      - {symbol: BTC, native: true, decimals: 8, receive: ` + receive + `}
`
	}
	for _, c := range []struct{ receive, want string }{
		{`{xpub: "` + xpub + `"}`, "p2pkh"},
		{`{xpub: "` + xpub + `", script_type: p2tr}`, "p2tr"},
		{`{xpub: "` + xpub + `", script_type: p2pkh}`, "p2pkh"},
		{`{xpub: "` + xpub + `", script_type: p2wpkh}`, "p2wpkh"}, // wallets export segwit accounts as xpubs too
		{`{xpub: "` + zpub + `"}`, "p2wpkh"},
	} {
		cfg, err := Parse([]byte(doc(c.receive)), getenv)
		if err != nil {
			t.Fatalf("receive %s: refused: %v", c.receive, err)
		}
		if got := cfg.Network("btc").Asset("BTC").ScriptType; got != c.want {
			t.Fatalf("receive %s: script type %q, want %q", c.receive, got, c.want)
		}
	}
	for _, c := range []struct{ receive, want string }{
		{`{xpub: "` + zpub + `", script_type: p2tr}`, "does not fit"},
		{`{xpub: "` + zpub + `", script_type: p2sh-p2wpkh}`, "does not fit"},
		{`{addresses: [bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu], script_type: p2tr}`, "receive.script_type goes with receive.xpub"},
	} {
		if _, err := Parse([]byte(doc(c.receive)), getenv); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("receive %s: %v, want an error saying %q", c.receive, err, c.want)
		}
	}
}
