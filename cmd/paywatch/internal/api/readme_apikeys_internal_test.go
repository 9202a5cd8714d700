package api

import (
	"strings"
	"testing"
)

// apiKeysNearMisses returns keys that come close to key without being it:
// of its length with one character changed (first, middle, last), every
// shorter prefix of it (the empty key included), and longer keys that
// start with it.
func apiKeysNearMisses(key string) map[string]string {
	near := map[string]string{}
	change := func(i int) string {
		b := []byte(key)
		b[i] ^= 0x01
		return string(b)
	}
	near[change(0)] = "same length, first character changed"
	near[change(len(key)/2)] = "same length, middle character changed"
	near[change(len(key)-1)] = "same length, last character changed"
	near[strings.ToUpper(key)] = "same length, upper case"
	for n := range len(key) {
		near[key[:n]] = "a prefix of the key"
	}
	near[key+"x"] = "the key with a character more"
	near[key+" "] = "the key with a space after it"
	near[key+key] = "the key twice"
	return near
}

// README: "paywatch keeps the keys only as SHA-256 hashes … and compares a
// presented key with every configured one in constant time". A key that
// comes close to a configured one (same length with one character off, a
// prefix of it, the key with more after it) is refused, and whatever the
// presented key's length every comparison is made by
// subtle.ConstantTimeCompare between two 32-byte SHA-256 hashes, with every
// configured key: neither a key's length nor how much of it matched can
// show in the time a lookup takes.
func TestAPIKeyLookupRefusesPrefixesLongerKeysAndNearMisses(t *testing.T) {
	cfg, k, calls := countingKeyring(t)
	for env, key := range authKeys {
		for presented, what := range apiKeysNearMisses(key) {
			if presented == key {
				continue
			}
			*calls = 0
			if got := k.lookup(presented); got != nil {
				t.Fatalf("%s (%q, near %s's key) is taken for key %q", what, presented, env, got.Name)
			}
			if *calls != len(cfg.APIKeys) {
				t.Fatalf("%s (%q): compared with %d of the %d keys, want every key", what, presented, *calls, len(cfg.APIKeys))
			}
		}
		*calls = 0
		if got := k.lookup(key); got == nil || *calls != len(cfg.APIKeys) {
			t.Fatalf("%s's own key found %+v after %d comparisons, want its key after %d", env, got, *calls, len(cfg.APIKeys))
		}
	}
}
