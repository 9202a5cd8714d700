package config

import (
	"strings"
	"testing"
)

// README ("Configuration"): "`assets[].unique_slots` | 10,000 | how many
// increments (k = 0 … slots−1) per address". A shared-address asset that
// leaves the key out gets 10,000 slots; one that gives it gets its own.
func TestUniqueSlotsDefaultsTo10000(t *testing.T) {
	cfg, err := Parse([]byte(base), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Network("ethereum").Asset("USDT").UniqueSlots; got != 10_000 {
		t.Errorf("unique_slots defaults to %d, README says 10,000", got)
	}
	c, err := parseWith(t, "        unique_step: \"0.000001\"\n", "        unique_step: \"0.000001\"\n        unique_slots: 50\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Network("ethereum").Asset("USDT").UniqueSlots; got != 50 {
		t.Errorf("unique_slots: 50 gives %d slots", got)
	}
}

// cookieBitcoin is a Bitcoin network's entry, with extra keys, to put
// before base's networks.
func cookieBitcoin(extra string) string {
	return `networks:
  - name: btc
    family: bitcoin
    chain: regtest
    rpc_urls: [http://127.0.0.1:18443]
` + extra + `    assets:
      - {symbol: BTC, native: true, decimals: 8, receive: {xpub: "vpub5SLqN2bLY4WeZF3kL4VqiWF1itbf3A6oRrq9aPf16AZMVWYCuN9TxpAZwCzVgW94TNzZPNc9XAHD4As6pdnExBtCDGYRmNJrcJ4eV9hNqcv"}}
`
}

// README ("Configuration"): "`networks[].rpc_cookie_file` | none | Bitcoin
// Core's `.cookie` file instead of a user and password". The key is the
// Bitcoin network's cookie file; given with a user or a password, or on
// an EVM network, it is refused, saying why.
func TestRPCCookieFileIsTakenAndRefusedWithAUserOrOnEVM(t *testing.T) {
	cfg, err := parseWith(t, "networks:\n", cookieBitcoin("    rpc_cookie_file: /var/lib/bitcoind/regtest/.cookie\n"))
	if err != nil {
		t.Fatal(err)
	}
	if btc := cfg.Network("btc"); btc.RPCCookieFile != "/var/lib/bitcoind/regtest/.cookie" || btc.RPCUser != "" || btc.RPCPass != "" {
		t.Fatalf("the network's cookie file is %q (user %q, password %q), want /var/lib/bitcoind/regtest/.cookie alone",
			btc.RPCCookieFile, btc.RPCUser, btc.RPCPass)
	}
	for _, c := range []struct {
		name, old, new, want string
	}{
		{"with a user", "networks:\n", cookieBitcoin("    rpc_cookie_file: /c\n    rpc_user_env: PAYWATCH_BTC_RPC_USER\n"),
			`networks[0] "btc" (line 6): rpc_cookie_file replaces rpc_user_env and rpc_pass_env: give one or the other`},
		{"with a password", "networks:\n", cookieBitcoin("    rpc_cookie_file: /c\n    rpc_pass_env: PAYWATCH_BTC_RPC_PASS\n"),
			`networks[0] "btc" (line 6): rpc_cookie_file replaces rpc_user_env and rpc_pass_env: give one or the other`},
		{"on an EVM network", "    chain_id: 1337\n", "    chain_id: 1337\n    rpc_cookie_file: /c\n",
			`networks[0] "ethereum" (line 6): rpc_cookie_file and rpc_cert_file are for family bitcoin`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseWith(t, c.old, c.new)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("a cookie file %s: the configuration is refused with %v, want %q", c.name, err, c.want)
			}
		})
	}
}
