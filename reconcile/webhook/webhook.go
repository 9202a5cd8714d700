// Package webhook is what a storefront needs to receive paywatch's
// webhooks: the event's shape and the check of its signature. It depends on
// the standard library alone, so a shop's code can import it without the
// rest of paywatch.
//
// Every delivery is a POST whose body is an Event and whose
// Paywatch-Signature header is
//
//	t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
//
// Verify checks it. Delivery is at least once: a receiver drops an event
// whose ID it has already handled.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Header is the name of the signature header.
const Header = "Paywatch-Signature"

// DefaultTolerance is how old (or how far ahead) a signature's timestamp
// may be by default: older deliveries may be replays.
const DefaultTolerance = 5 * time.Minute

// Event is the body of a webhook delivery.
type Event struct {
	// ID is stable across retries and redeliveries: de-duplicate by it.
	ID string `json:"id"`
	// Type is order.confirming, order.settled, order.disputed,
	// order.expired, order.cancelled, order.refunded or
	// order.customer_marked_paid.
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
	// Order is the order as it was when the event happened, in the API's
	// Order representation.
	Order json.RawMessage `json:"order"`
}

// Errors Verify returns (wrapped).
var (
	// ErrMalformed: the header is missing or not of the form t=…,v1=….
	ErrMalformed = errors.New("webhook: malformed signature header")
	// ErrMismatch: no v1 signature matches the body under the secret.
	ErrMismatch = errors.New("webhook: signature does not match")
	// ErrStale: the timestamp is outside the tolerance.
	ErrStale = errors.New("webhook: signature timestamp outside the tolerance")
	// ErrNoSecret: the secret is empty (an unset variable, most likely):
	// anyone could sign with it.
	ErrNoSecret = errors.New("webhook: the secret is empty")
)

// Sign returns the Paywatch-Signature header value for body sent at t.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// Verify checks that header signs body under secret, and that its
// timestamp is within tolerance of now (0 means DefaultTolerance). Pass the
// raw request body, before any JSON decoding. The header may carry several
// v1 signatures (while a secret is being rotated); one matching is enough.
func Verify(secret, header string, body []byte, tolerance time.Duration) error {
	return VerifyAt(secret, header, body, tolerance, time.Now())
}

// VerifyAt is Verify with the current time given.
func VerifyAt(secret, header string, body []byte, tolerance time.Duration, now time.Time) error {
	if secret == "" {
		return ErrNoSecret
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	ts, sigs, err := parse(header)
	if err != nil {
		return err
	}
	want := mac(secret, ts, body)
	ok := false
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			ok = true
		}
	}
	if !ok {
		return ErrMismatch
	}
	sec, _ := strconv.ParseInt(ts, 10, 64)
	if age := now.Sub(time.Unix(sec, 0)); age > tolerance || age < -tolerance {
		return fmt.Errorf("%w: signed %s ago, tolerance %s", ErrStale, age.Round(time.Second), tolerance)
	}
	return nil
}

// parse splits a header into its timestamp and v1 signatures. Unknown
// keys are ignored, so that new schemes can be added beside v1.
func parse(header string) (ts string, sigs [][]byte, err error) {
	if header == "" || len(header) > 4096 {
		return "", nil, ErrMalformed
	}
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return "", nil, fmt.Errorf("%w: %q is not key=value", ErrMalformed, part)
		}
		switch k {
		case "t":
			if ts != "" {
				return "", nil, fmt.Errorf("%w: two timestamps", ErrMalformed)
			}
			if n, err := strconv.ParseInt(v, 10, 64); err != nil || n <= 0 || strconv.FormatInt(n, 10) != v {
				return "", nil, fmt.Errorf("%w: timestamp %q is not unix seconds", ErrMalformed, v)
			}
			ts = v
		case "v1":
			s, err := hex.DecodeString(v)
			if err != nil || len(s) != sha256.Size {
				return "", nil, fmt.Errorf("%w: v1 is not a hex SHA-256 MAC", ErrMalformed)
			}
			sigs = append(sigs, s)
		}
	}
	if ts == "" || len(sigs) == 0 {
		return "", nil, fmt.Errorf("%w: t and v1 are required", ErrMalformed)
	}
	return ts, sigs, nil
}
