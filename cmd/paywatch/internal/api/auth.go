package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
)

// keyring holds the API keys hashed: the plain keys are not kept.
type keyring struct {
	keys []hashedKey
	// equal compares two hashes: subtle.ConstantTimeCompare.
	equal func(a, b []byte) int
}

type hashedKey struct {
	hash [sha256.Size]byte
	key  config.APIKey // Key field cleared
}

func newKeyring(keys []config.APIKey) *keyring {
	k := &keyring{equal: subtle.ConstantTimeCompare}
	for _, c := range keys {
		if c.Key == "" {
			continue // cleared by an earlier New: no key, and never the empty one
		}
		h := hashedKey{hash: sha256.Sum256([]byte(c.Key)), key: c}
		h.key.Key = ""
		k.keys = append(k.keys, h)
	}
	return k
}

// lookup finds the key matching presented. It compares with every key in
// constant time, so timing tells nothing about which key came close.
func (k *keyring) lookup(presented string) *config.APIKey {
	sum := sha256.Sum256([]byte(presented))
	var found *config.APIKey
	for i := range k.keys {
		if k.equal(sum[:], k.keys[i].hash[:]) == 1 {
			found = &k.keys[i].key
		}
	}
	return found
}

func allowed(have, need config.Role) bool {
	return have == need || have == config.RoleOperator
}

// authorize checks the bearer key and its role, then runs h.
func (s *Server) authorize(need config.Role, h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		token, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="paywatch"`)
			writeError(w, paywatch.Errorf(paywatch.CodeUnauthorized, "missing API key: send Authorization: Bearer <key>"), 0)
			return
		}
		caller := s.keys.lookup(token)
		if caller == nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="paywatch", error="invalid_token"`)
			writeError(w, paywatch.Errorf(paywatch.CodeUnauthorized, "unknown API key"), 0)
			return
		}
		if l := logEntry(w); l != nil {
			l.key = caller.Name
		}
		if !allowed(caller.Role, need) {
			writeError(w, paywatch.Errorf(paywatch.CodeForbidden, "key %q has role %s; this endpoint needs %s", caller.Name, caller.Role, need), 0)
			return
		}
		if err := h(w, r, caller); err != nil {
			if paywatch.ErrorCode(err) == paywatch.CodeInternal {
				s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeError(w, err, 0)
		}
	})
}
