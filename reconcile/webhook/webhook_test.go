package webhook_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/paywatch/paywatch/reconcile/webhook"
)

func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"id":"evt_1","type":"order.settled","created_at":"2027-01-15T08:00:00Z","order":{"id":"ord_1"}}`)
	header := webhook.Sign("whsec_right", now, body)
	cases := []struct {
		name    string
		secret  string
		header  string
		body    []byte
		at      time.Time
		wantErr error
	}{
		{"valid", "whsec_right", header, body, now, nil},
		{"valid a minute later", "whsec_right", header, body, now.Add(time.Minute), nil},
		{"changed body", "whsec_right", header, []byte(strings.Replace(string(body), "settled", "expired", 1)), now, webhook.ErrMismatch},
		{"one byte appended", "whsec_right", header, append(append([]byte{}, body...), ' '), now, webhook.ErrMismatch},
		{"wrong secret", "whsec_wrong", header, body, now, webhook.ErrMismatch},
		{"stale", "whsec_right", header, body, now.Add(6 * time.Minute), webhook.ErrStale},
		{"from the future", "whsec_right", header, body, now.Add(-6 * time.Minute), webhook.ErrStale},
		{"timestamp moved", "whsec_right", strings.Replace(header, "t=1800000000", "t=1800000060", 1), body, now, webhook.ErrMismatch},
		{"missing", "whsec_right", "", body, now, webhook.ErrMalformed},
		{"no v1", "whsec_right", "t=1800000000", body, now, webhook.ErrMalformed},
		{"no t", "whsec_right", header[strings.Index(header, "v1="):], body, now, webhook.ErrMalformed},
		{"v1 not hex", "whsec_right", "t=1800000000,v1=zz", body, now, webhook.ErrMalformed},
		{"second v1 matches", "whsec_right", "t=1800000000,v1=" + strings.Repeat("00", 32) + "," + header[strings.Index(header, "v1="):], body, now, nil},
		{"two timestamps", "whsec_right", header + ",t=1800000000", body, now, webhook.ErrMalformed},
		{"signed timestamp with a sign", "whsec_right", strings.Replace(header, "t=", "t=+", 1), body, now, webhook.ErrMalformed},
		{"empty secret, signed with it", "", webhook.Sign("", now, body), body, now, webhook.ErrNoSecret},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := webhook.VerifyAt(c.secret, c.header, c.body, 5*time.Minute, c.at)
			if c.wantErr == nil && err != nil {
				t.Fatalf("VerifyAt = %v, want nil", err)
			}
			if c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Fatalf("VerifyAt = %v, want %v", err, c.wantErr)
			}
		})
	}
}

func TestSignIsTheDocumentedHMAC(t *testing.T) {
	// HMAC-SHA256("secret", "1700000000.{}"), computed independently
	// (printf '1700000000.{}' | openssl dgst -sha256 -hmac secret).
	got := webhook.Sign("secret", time.Unix(1_700_000_000, 0), []byte("{}"))
	want := "t=1700000000,v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"
	if got != want {
		t.Fatalf("Sign = %s", got)
	}
}

func FuzzVerify(f *testing.F) {
	f.Add("t=1800000000,v1="+strings.Repeat("ab", 32), []byte("{}"))
	f.Add("t=1,v1=00,v1=", []byte(""))
	f.Add(",,,=", []byte("x"))
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		err := webhook.VerifyAt("s", header, body, time.Minute, time.Unix(1_800_000_000, 0))
		if err == nil && header != webhook.Sign("s", time.Unix(1_800_000_000, 0), body) {
			// A header other than the one Sign makes can only verify if it
			// carries that same MAC.
			if !strings.Contains(header, webhook.Sign("s", time.Unix(1_800_000_000, 0), body)[len("t=1800000000,"):]) {
				t.Fatalf("header %q verified without the right MAC", header)
			}
		}
	})
}

// A storefront's receiver: verify the raw body, then act on the event once.
func ExampleVerify() {
	secret := "whsec_from_the_config"
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "cannot read body", http.StatusBadRequest)
			return
		}
		if err := webhook.Verify(secret, r.Header.Get(webhook.Header), body, 0); err != nil {
			http.Error(w, "bad signature", http.StatusBadRequest)
			return
		}
		// Decode webhook.Event, skip an ID already handled, act on Type.
		w.WriteHeader(http.StatusNoContent)
	})

	body := `{"id":"evt_1","type":"order.settled","created_at":"2026-11-30T12:00:00Z","order":{}}`
	req := httptest.NewRequest("POST", "/paywatch", strings.NewReader(body))
	req.Header.Set(webhook.Header, webhook.Sign(secret, time.Now(), []byte(body)))
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Println(rec.Code)

	req = httptest.NewRequest("POST", "/paywatch", strings.NewReader(strings.Replace(body, "settled", "refunded", 1)))
	req.Header.Set(webhook.Header, webhook.Sign(secret, time.Now(), []byte(body)))
	rec = httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Println(rec.Code)
	// Output:
	// 204
	// 400
}
