package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
)

const authConfig = `
database_url_env: DB
api_keys:
  - {name: shop, role: storefront, key_env: SF_KEY}
  - {name: shop2, role: storefront, key_env: SF2_KEY}
  - {name: alice, role: operator, key_env: OP_KEY}
networks:
  - name: ethereum
    family: evm
    rpc_urls: [http://127.0.0.1:1]
    chain_id: 1
    assets:
      - {symbol: USDT, contract: "0xdAC17F958D2ee523a2206206994597C13D831ec7", decimals: 6, unique_step: "0.000001",
         receive: {addresses: ["0x1111111111111111111111111111111111111111"]}}
`

var authKeys = map[string]string{"SF_KEY": "sf_auth_0123456789abcdef", "SF2_KEY": "sf_auth_fedcba9876543210",
	"OP_KEY": "op_auth_0123456789abcdef"}

// authEnv is the environment the configuration reads its keys from.
func authEnv(k string) string {
	if k == "DB" {
		return "postgres://unused"
	}
	return authKeys[k]
}

// findText walks everything reachable from v (fields, unexported ones
// included, pointers, slices, maps, interfaces) and returns the path of a
// string or byte sequence that contains one of secrets, or "".
func findText(v reflect.Value, path string, secrets []string, seen map[uintptr]bool) string {
	contains := func(s string) bool {
		for _, k := range secrets {
			if strings.Contains(s, k) {
				return true
			}
		}
		return false
	}
	switch v.Kind() {
	case reflect.String:
		if contains(v.String()) {
			return path
		}
	case reflect.Pointer:
		if v.IsNil() || seen[v.Pointer()] {
			return ""
		}
		seen[v.Pointer()] = true
		return findText(v.Elem(), path, secrets, seen)
	case reflect.Interface:
		if !v.IsNil() {
			return findText(v.Elem(), path, secrets, seen)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if p := findText(v.Field(i), path+"."+v.Type().Field(i).Name, secrets, seen); p != "" {
				return p
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && (v.IsNil() || seen[v.Pointer()]) {
			return ""
		}
		if v.Kind() == reflect.Slice {
			seen[v.Pointer()] = true
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			b := make([]byte, v.Len())
			for i := range b {
				b[i] = byte(v.Index(i).Uint())
			}
			if contains(string(b)) {
				return path
			}
			return ""
		}
		for i := range v.Len() {
			if p := findText(v.Index(i), path+"[]", secrets, seen); p != "" {
				return p
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if p := findText(it.Key(), path+"{key}", secrets, seen); p != "" {
				return p
			}
			if p := findText(it.Value(), path+"{}", secrets, seen); p != "" {
				return p
			}
		}
	}
	return ""
}

// README: "Keys are kept only as SHA-256 hashes in memory". Once the API is
// built, no plain key is reachable from it (its configuration included),
// and the keyring holds each key's SHA-256 hash.
func TestAPIKeysAreKeptOnlyAsSHA256Hashes(t *testing.T) {
	cfg, err := config.Parse([]byte(authConfig), authEnv)
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, Deps{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var secrets []string
	for _, k := range authKeys {
		secrets = append(secrets, k)
	}
	if p := findText(reflect.ValueOf(s), "Server", secrets, map[uintptr]bool{}); p != "" {
		t.Fatalf("a plain API key is kept in memory at %s", p)
	}
	if len(s.keys.keys) != len(cfg.APIKeys) {
		t.Fatalf("the keyring holds %d keys, want %d", len(s.keys.keys), len(cfg.APIKeys))
	}
	for _, k := range s.keys.keys {
		env := map[string]string{"shop": "SF_KEY", "shop2": "SF2_KEY", "alice": "OP_KEY"}[k.key.Name]
		if k.hash != sha256.Sum256([]byte(authKeys[env])) {
			t.Fatalf("key %q is kept as %x, not as the SHA-256 hash of the key", k.key.Name, k.hash)
		}
	}
	// And the keys still work: each finds its own name and role.
	for name, env := range map[string]string{"shop": "SF_KEY", "shop2": "SF2_KEY", "alice": "OP_KEY"} {
		if got := s.keys.lookup(authKeys[env]); got == nil || got.Name != name {
			t.Fatalf("key %s found %+v, want %s", env, got, name)
		}
	}
}

// README: "Keys are ... compared in constant time." The comparison is
// subtle.ConstantTimeCompare over SHA-256 hashes, and every lookup compares
// the presented key with every configured key, whichever matches (the
// first, the last, or none): how long a lookup takes does not tell which
// key came close.
func TestAPIKeysAreComparedInConstantTimeWithEveryKey(t *testing.T) {
	if got, want := reflect.ValueOf(newKeyring(nil).equal).Pointer(), reflect.ValueOf(subtle.ConstantTimeCompare).Pointer(); got != want {
		t.Fatal("API keys are not compared with subtle.ConstantTimeCompare")
	}
	cfg, k, calls := countingKeyring(t)
	for _, c := range []struct{ presented, want string }{
		{authKeys["SF_KEY"], "shop"}, // the first key
		{authKeys["SF2_KEY"], "shop2"},
		{authKeys["OP_KEY"], "alice"},           // the last key
		{"sf_auth_0123456789abcdeX", ""},        // one character off the first
		{"not a key of this daemon at all", ""}, // nothing close
	} {
		*calls = 0
		got := k.lookup(c.presented)
		if (got == nil) != (c.want == "") || (got != nil && got.Name != c.want) {
			t.Fatalf("lookup of %q found %+v, want %q", c.presented, got, c.want)
		}
		if *calls != len(cfg.APIKeys) {
			t.Fatalf("lookup of %q (key %q) compared %d of the %d keys: it stops early, so its time tells which key matched",
				c.presented, c.want, *calls, len(cfg.APIKeys))
		}
	}
}

// New takes the plain keys out of the configuration it is given: a second
// New on the same configuration authorizes nobody (it fails closed, never
// open: no empty key is taken for one), and the first keeps its keys.
func TestSecondNewOnTheSameConfigFailsClosed(t *testing.T) {
	cfg, err := config.Parse([]byte(authConfig), authEnv)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	first := New(cfg, Deps{}, log)
	second := New(cfg, Deps{}, log)
	if len(second.keys.keys) != 0 {
		t.Fatalf("a second New on the same configuration holds %d keys, want none", len(second.keys.keys))
	}
	for _, tok := range []string{"", " ", authKeys["OP_KEY"], authKeys["SF_KEY"]} {
		if second.keys.lookup(tok) != nil {
			t.Fatalf("the second server accepts the key %q", tok)
		}
	}
	if first.keys.lookup(authKeys["OP_KEY"]) == nil {
		t.Fatal("the first server lost its keys")
	}
	h := second.authorize(config.RoleOperator, func(w http.ResponseWriter, r *http.Request, _ *config.APIKey) error {
		t.Fatal("a request reached the handler of a server with no keys")
		return nil
	})
	for _, hdr := range []string{"", "Bearer ", "Bearer  ", "Bearer " + authKeys["OP_KEY"]} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		if hdr != "" {
			req.Header.Set("Authorization", hdr)
		}
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized {
			t.Fatalf("Authorization %q: %d, want 401", hdr, rec.Code)
		}
	}
}

// countingKeyring is the keyring of authConfig, whose comparisons are
// counted in calls and must each be between two SHA-256 hashes.
func countingKeyring(t *testing.T) (*config.Config, *keyring, *int) {
	t.Helper()
	cfg, err := config.Parse([]byte(authConfig), authEnv)
	if err != nil {
		t.Fatal(err)
	}
	k := newKeyring(cfg.APIKeys)
	calls := new(int)
	k.equal = func(a, b []byte) int {
		*calls++
		if len(a) != sha256.Size || len(b) != sha256.Size {
			t.Fatalf("compared %d with %d bytes, want two SHA-256 hashes of %d bytes", len(a), len(b), sha256.Size)
		}
		return subtle.ConstantTimeCompare(a, b)
	}
	return cfg, k, calls
}
