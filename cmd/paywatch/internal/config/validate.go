package config

import (
	"fmt"
	"math/big"
	"net"
	"net/url"
	"regexp"
	"runtime"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/evm"
)

// Defaults for keys that may be left out.
const (
	DefaultListen           = "127.0.0.1:8080"
	DefaultExpiry           = time.Hour
	DefaultMaxExpiry        = 7 * 24 * time.Hour
	DefaultMonitoringWindow = 24 * time.Hour
	DefaultPaidGrace        = 2 * time.Hour
	DefaultSchedule         = "@every 15s"
	DefaultUniqueSlots      = 10000
	MaxUniqueSlots          = 1_000_000
	MinKeyLength            = 16
	// DefaultGapLimit is what most wallets look ahead for payments to
	// addresses of an account.
	DefaultGapLimit = 20
	// DefaultWebhookMaxRetryAge is how long a webhook is retried.
	DefaultWebhookMaxRetryAge = 72 * time.Hour
	// MinDatabaseAPIConns is the least database_api_conns defaults to;
	// MaxDatabaseAPIConns the most it may be set to.
	MinDatabaseAPIConns = 4
	MaxDatabaseAPIConns = 200
)

// DefaultDatabaseAPIConns is the pool the API's requests share when the
// file gives none: twice the cores this process may use, and at least
// MinDatabaseAPIConns. A request's statements take PostgreSQL well under
// a millisecond each; more of them at once than the cores can run only
// wait in the operating system's run queue, where the unlucky wait a
// whole time slice, while a request that waits in the pool waits for the
// next connection let go.
func DefaultDatabaseAPIConns() int { return max(MinDatabaseAPIConns, 2*runtime.GOMAXPROCS(0)) }

var (
	namePattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	symbolPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$`)
)

type validator struct {
	getenv   func(string) string
	problems []error
}

// fail records a problem. where names its place and may hold names from
// the file (a network called "100%"): it is never part of the format.
func (v *validator) fail(where, format string, args ...any) {
	err := fmt.Errorf(format, args...)
	if where != "" {
		err = fmt.Errorf("%s: %w", where, err)
	}
	v.problems = append(v.problems, err)
}

// secret resolves an *_env key; key is the YAML key for messages.
func (v *validator) secret(where, key, env string, required bool) string {
	if env == "" {
		if required {
			v.fail(where, "%s is required", key)
		}
		return ""
	}
	val := v.getenv(env)
	if val == "" {
		v.fail(where, "%s names environment variable %s, which is not set", key, env)
	}
	return val
}

func durationOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (v *validator) config(raw *rawConfig) *Config {
	cfg := &Config{
		Listen: raw.Listen,
		Orders: Orders{
			DefaultExpiry:    durationOr(raw.Orders.DefaultExpiry, DefaultExpiry),
			MaxExpiry:        durationOr(raw.Orders.MaxExpiry, DefaultMaxExpiry),
			MonitoringWindow: durationOr(raw.Orders.MonitoringWindow, DefaultMonitoringWindow),
			PaidGrace:        durationOr(raw.Orders.PaidGrace, DefaultPaidGrace),
		},
		ReconcilerSchedule: raw.Reconciler.Schedule,
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		v.fail("listen", "%q is not host:port", cfg.Listen)
	}
	cfg.DatabaseURL = v.secret("", "database_url_env", raw.DatabaseURLEnv, true)
	switch cfg.DatabaseAPIConns = raw.DatabaseAPIConns.n; {
	case !raw.DatabaseAPIConns.set:
		cfg.DatabaseAPIConns = DefaultDatabaseAPIConns()
	case cfg.DatabaseAPIConns < 1 || cfg.DatabaseAPIConns > MaxDatabaseAPIConns:
		v.fail("", "database_api_conns %d must be between 1 and %d", cfg.DatabaseAPIConns, MaxDatabaseAPIConns)
	}

	o := cfg.Orders
	for _, d := range []struct {
		key string
		val time.Duration
	}{{"default_expiry", o.DefaultExpiry}, {"max_expiry", o.MaxExpiry}, {"monitoring_window", o.MonitoringWindow}, {"paid_grace", o.PaidGrace}} {
		if d.val < 0 {
			v.fail("orders", "%s must not be negative", d.key)
		}
	}
	if o.DefaultExpiry < time.Minute || o.DefaultExpiry > o.MaxExpiry {
		v.fail("orders", "default_expiry %s must be between 1m and max_expiry (%s)", o.DefaultExpiry, o.MaxExpiry)
	}

	if cfg.ReconcilerSchedule == "" {
		cfg.ReconcilerSchedule = DefaultSchedule
	}
	if _, err := cron.ParseStandard(cfg.ReconcilerSchedule); err != nil {
		v.fail("reconciler", "schedule %q: %v", cfg.ReconcilerSchedule, err)
	}

	if raw.Webhooks.URL != "" {
		v.httpURL("webhooks", "url", raw.Webhooks.URL)
		cfg.WebhookURL = raw.Webhooks.URL
		cfg.WebhookSecret = v.secret("webhooks", "secret_env", raw.Webhooks.SecretEnv, true)
	}
	cfg.WebhookAllowPrivate = raw.Webhooks.AllowPrivateNetworks
	cfg.WebhookMaxRetryAge = durationOr(raw.Webhooks.MaxRetryAge, DefaultWebhookMaxRetryAge)
	if cfg.WebhookMaxRetryAge < time.Minute {
		v.fail("webhooks", "max_retry_age %s must be at least 1m", cfg.WebhookMaxRetryAge)
	}

	cfg.APIKeys = v.apiKeys(raw.APIKeys)

	if len(raw.Networks) == 0 {
		v.fail("networks", "at least one network is required")
	}
	names := map[string]bool{}
	for i := range raw.Networks {
		n := v.network(i, &raw.Networks[i])
		if n == nil {
			continue
		}
		if names[n.Name] {
			v.fail(fmt.Sprintf("networks[%d]", i), "network name %q is used twice", n.Name)
		}
		names[n.Name] = true
		cfg.Networks = append(cfg.Networks, n)
	}
	return cfg
}

func (v *validator) httpURL(where, key, s string) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.fail(where, "%s %q is not an http(s) URL", key, s)
	}
}

func (v *validator) apiKeys(raw []rawAPIKey) []APIKey {
	if len(raw) == 0 {
		v.fail("api_keys", "at least one key is required")
	}
	var keys []APIKey
	names, values := map[string]bool{}, map[string]bool{}
	for i, k := range raw {
		where := fmt.Sprintf("api_keys[%d]", i)
		if k.Name == "" {
			v.fail(where, "name is required")
		} else if names[k.Name] {
			v.fail(where, "key name %q is used twice", k.Name)
		}
		names[k.Name] = true
		role := Role(k.Role)
		if role != RoleStorefront && role != RoleOperator {
			v.fail(where, "role %q is unknown (want storefront or operator)", k.Role)
		}
		val := v.secret(where, "key_env", k.KeyEnv, true)
		if val != "" && len(val) < MinKeyLength {
			v.fail(where, "the key in %s is shorter than %d characters", k.KeyEnv, MinKeyLength)
		}
		if val != "" && values[val] {
			v.fail(where, "the key in %s is the same as another key's", k.KeyEnv)
		}
		values[val] = true
		keys = append(keys, APIKey{Name: k.Name, Role: role, Key: val})
	}
	return keys
}

func (v *validator) network(i int, r *rawNetwork) *paywatch.Network {
	where := fmt.Sprintf("networks[%d] (line %d)", i, r.line)
	if r.Name != "" {
		where = fmt.Sprintf("networks[%d] %q (line %d)", i, r.Name, r.line)
	}
	switch {
	case r.Name == "":
		v.fail(where, "name is required")
	case !namePattern.MatchString(r.Name):
		v.fail(where, "name %q must be lowercase letters, digits and dashes (at most 63 characters, not starting with a dash)", r.Name)
	}
	n := &paywatch.Network{
		Name:         r.Name,
		Family:       paywatch.Family(r.Family),
		RPCURLs:      r.RPCURLs,
		ChainID:      r.ChainID,
		Chain:        r.Chain,
		PollInterval: r.PollInterval,
		StartBlock:   r.StartBlock.number,
		StartLatest:  r.StartBlock.latest || !r.StartBlock.set,
	}
	switch n.Family {
	case paywatch.FamilyEVM:
		if r.ChainID == 0 {
			v.fail(where, "chain_id is required for family evm")
		}
		if r.Chain != "" {
			v.fail(where, "chain is for family bitcoin; an evm network has chain_id")
		}
	case paywatch.FamilyBitcoin:
		if _, err := bitcoin.Params(r.Chain); err != nil {
			v.fail(where, "%v", err)
		}
		if r.ChainID != 0 {
			v.fail(where, "chain_id is for family evm; a bitcoin network has chain")
		}
	default:
		v.fail(where, "family %q is unknown (want evm or bitcoin)", r.Family)
		return nil
	}
	if len(r.RPCURLs) == 0 {
		v.fail(where, "rpc_urls needs at least one URL")
	}
	for _, u := range r.RPCURLs {
		v.httpURL(where, "rpc_urls entry", u)
	}
	n.RPCUser = v.secret(where, "rpc_user_env", r.RPCUserEnv, false)
	n.RPCPass = v.secret(where, "rpc_pass_env", r.RPCPassEnv, false)
	n.RPCCookieFile, n.RPCCertFile = r.RPCCookieFile, r.RPCCertFile
	if (r.RPCCookieFile != "" || r.RPCCertFile != "") && n.Family != paywatch.FamilyBitcoin {
		v.fail(where, "rpc_cookie_file and rpc_cert_file are for family bitcoin")
	}
	if r.RPCCookieFile != "" && (r.RPCUserEnv != "" || r.RPCPassEnv != "") {
		v.fail(where, "rpc_cookie_file replaces rpc_user_env and rpc_pass_env: give one or the other")
	}
	switch {
	case r.Confirmations.finalized:
		if n.Family != paywatch.FamilyEVM {
			v.fail(where, "confirmations: finalized is for evm networks")
		}
		n.UseFinalized = true
	case r.Confirmations.set:
		n.Confirmations = r.Confirmations.count
	case n.Family == paywatch.FamilyEVM:
		n.Confirmations = 12
	default:
		n.Confirmations = 6
	}
	if n.PollInterval == 0 {
		n.PollInterval = 5 * time.Second
	}
	if n.PollInterval < 100*time.Millisecond || n.PollInterval > time.Hour {
		v.fail(where, "poll_interval %s must be between 100ms and 1h", n.PollInterval)
	}

	if len(r.Assets) == 0 {
		v.fail(where, "at least one asset is required")
	}
	symbols, contracts := map[string]bool{}, map[string]bool{}
	natives := 0
	for j := range r.Assets {
		a := v.asset(where, j, n, &r.Assets[j])
		if a == nil {
			continue
		}
		if symbols[a.Symbol] {
			v.fail(where, "asset symbol %q is used twice", a.Symbol)
		}
		symbols[a.Symbol] = true
		if a.Native {
			natives++
		} else if contracts[a.Contract] {
			v.fail(where, "contract %s is configured twice", a.Contract)
		}
		contracts[a.Contract] = true
		n.Assets = append(n.Assets, a)
	}
	if natives > 1 {
		v.fail(where, "only one asset may be native")
	}
	return n
}

func (v *validator) asset(netWhere string, j int, n *paywatch.Network, r *rawAsset) *paywatch.Asset {
	where := fmt.Sprintf("%s assets[%d] %q (line %d)", netWhere, j, r.Symbol, r.line)
	if !symbolPattern.MatchString(r.Symbol) {
		v.fail(where, "symbol %q must be letters, digits, dot, dash or underscore", r.Symbol)
	}
	a := &paywatch.Asset{Network: n.Name, Symbol: r.Symbol, Native: r.Native}
	if r.Decimals == nil {
		v.fail(where, "decimals is required")
		return nil
	}
	if *r.Decimals < 0 || *r.Decimals > paywatch.MaxDecimals {
		v.fail(where, "decimals %d is out of range (0 to %d)", *r.Decimals, paywatch.MaxDecimals)
		return nil
	}
	a.Decimals = int32(*r.Decimals)

	switch {
	case r.Native && r.Contract != "":
		v.fail(where, "a native asset has no contract")
	case !r.Native && n.Family == paywatch.FamilyBitcoin:
		v.fail(where, "bitcoin assets must be native")
	case !r.Native && r.Contract == "":
		v.fail(where, "a token needs its contract address (or native: true)")
	case !r.Native:
		c, err := evm.ParseAddress(r.Contract)
		if err != nil {
			v.fail(where, "contract: %v", err)
		}
		a.Contract = c
	}

	if r.MaxAmount != "" {
		m, err := paywatch.ParseUnits(r.MaxAmount, a.Decimals, a.Symbol, nil)
		if err != nil {
			v.fail(where, "max_amount: %s", paywatch.ErrorMessage(err))
		}
		a.MaxAmount = m
	}
	a.Dust = new(big.Int)
	if n.Family == paywatch.FamilyBitcoin && a.Decimals == 8 {
		// Bitcoin's own dust threshold for the costliest common output
		// (P2PKH): less than this is never a customer's payment.
		a.Dust = big.NewInt(DefaultBitcoinDust)
	}
	if r.Dust != "" {
		d, err := paywatch.ParseUnits(r.Dust, a.Decimals, a.Symbol, nil)
		if err != nil {
			v.fail(where, "dust: %s", paywatch.ErrorMessage(err))
		} else {
			a.Dust = d
		}
	}

	rcv := r.Receive
	switch {
	case len(rcv.Addresses) > 0 && rcv.XPub != "":
		v.fail(where, "receive takes addresses or xpub, not both")
	case len(rcv.Addresses) > 0:
		a.Mode = paywatch.ModeShared
		seen := map[string]bool{}
		for _, addr := range rcv.Addresses {
			norm, err := v.address(n, addr)
			if err != nil {
				v.fail(where, "receive address: %v", err)
				continue
			}
			if seen[norm] {
				v.fail(where, "receive address %s is listed twice", norm)
			}
			seen[norm] = true
			a.Addresses = append(a.Addresses, norm)
		}
		if r.UniqueStep == "" {
			v.fail(where, "unique_step is required with shared receive addresses")
		} else if step, err := paywatch.ParseStep(r.UniqueStep, a.Decimals, a.Symbol); err != nil {
			v.fail(where, "unique_step: %s", paywatch.ErrorMessage(err))
		} else {
			a.UniqueStep = step
		}
		a.UniqueSlots = r.UniqueSlots
		if a.UniqueSlots == 0 {
			a.UniqueSlots = DefaultUniqueSlots
		}
		if a.UniqueSlots < 1 || a.UniqueSlots > MaxUniqueSlots {
			v.fail(where, "unique_slots %d is out of range (1 to %d)", a.UniqueSlots, MaxUniqueSlots)
		}
	case rcv.XPub != "":
		a.Mode = paywatch.ModePerOrder
		if n.Family != paywatch.FamilyBitcoin {
			v.fail(where, "receive.xpub (an address per order) needs family bitcoin")
			break
		}
		if r.UniqueStep != "" || r.UniqueSlots != 0 {
			v.fail(where, "unique_step and unique_slots apply to shared addresses, not to receive.xpub")
		}
		d, err := bitcoin.NewDeriver(rcv.XPub, n.Chain, rcv.ScriptType)
		if err != nil {
			v.fail(where, "receive.xpub: %v", err)
			break
		}
		a.XPub = rcv.XPub
		a.ScriptType = d.ScriptType()
	default:
		v.fail(where, "receive needs addresses or xpub")
	}
	if rcv.ScriptType != "" && rcv.XPub == "" {
		v.fail(where, "receive.script_type goes with receive.xpub")
	}
	a.GapLimit = DefaultGapLimit
	if rcv.GapLimit != nil {
		if rcv.XPub == "" {
			v.fail(where, "receive.gap_limit goes with receive.xpub")
		}
		if *rcv.GapLimit < 1 || *rcv.GapLimit > 1_000_000 {
			v.fail(where, "receive.gap_limit %d is out of range (1 to 1000000)", *rcv.GapLimit)
		}
		a.GapLimit = *rcv.GapLimit
	}
	if r.VerifyBalance != nil {
		if a.Native || n.Family != paywatch.FamilyEVM {
			v.fail(where, "verify_balance is for EVM tokens")
		}
		a.SkipBalanceCheck = !*r.VerifyBalance
	}
	return a
}

// address validates a receiving address for the network's family and
// returns its normal form.
func (v *validator) address(n *paywatch.Network, s string) (string, error) {
	switch n.Family {
	case paywatch.FamilyEVM:
		return evm.ParseAddress(s)
	case paywatch.FamilyBitcoin:
		if n.Chain == "" {
			return s, nil // the chain error is reported already
		}
		return s, bitcoin.ValidateAddress(s, n.Chain)
	}
	return s, nil
}
