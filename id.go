package paywatch

import (
	"crypto/rand"
	"encoding/base32"
)

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewID returns a random identifier with a type prefix ("ord_…", "trf_…",
// "evt_…"): 120 random bits, lowercase.
func NewID(prefix string) string {
	var b [15]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + idEncoding.EncodeToString(b[:])
}
