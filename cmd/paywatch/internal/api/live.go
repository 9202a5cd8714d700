package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
)

// MaxWait is the longest a long-poll (GET /v1/orders/{id}?wait=) holds.
const MaxWait = 60 * time.Second

// Long-poll limits: how many may wait at once (more answer 429
// rate_limited), and how often one re-reads its order when woken (blocks
// come fast while a scanner catches up).
const (
	MaxWaiting   = 10_000
	minRereadGap = 250 * time.Millisecond
)

// Changes wakes long-polls when an order may have changed.
type Changes interface {
	Subscribe(orderID, network string) (<-chan struct{}, func())
}

// Drain ends the long-polls in flight (each answers what it has): the
// server is shutting down.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// renderOrder reads an order and returns its JSON and entity tag.
func (s *Server) renderOrder(r *http.Request, id string) (*paywatch.Order, []byte, string, error) {
	o, err := s.store.Get(r.Context(), id)
	if err != nil {
		return nil, nil, "", err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s.orderView(o)); err != nil {
		return nil, nil, "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	return o, buf.Bytes(), `"` + hex.EncodeToString(sum[:16]) + `"`, nil
}

// matches reports whether an If-None-Match header names etag.
func matches(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == etag || t == "*" {
			return true
		}
	}
	return false
}

// getOrder answers an Order with its ETag; 304 when If-None-Match names
// the current version. With ?wait=D (at most MaxWait) it holds the request
// until the order differs from the If-None-Match version (or, without one,
// from its state when the request arrived), then answers at once.
func (s *Server) getOrder(w http.ResponseWriter, r *http.Request, caller *config.APIKey) error {
	if l := logEntry(w); l != nil && caller.Role == config.RoleStorefront {
		l.routine = true // what a checkout page polls
	}
	q, _, err := query(r, "wait")
	if err != nil {
		return err
	}
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 || wait > MaxWait {
			return paywatch.Errorf(paywatch.CodeInvalidRequest, "wait must be a duration from 0s to %s, such as 30s", MaxWait)
		}
	}
	id := r.PathValue("id")
	o, body, etag, err := s.renderOrder(r, id)
	if err != nil {
		return err
	}
	inm := r.Header.Get("If-None-Match")
	if wait > 0 && s.changes != nil && (inm == "" || matches(inm, etag)) {
		if s.waiting.Add(1) > s.maxWaiting {
			s.waiting.Add(-1)
			return paywatch.Errorf(paywatch.CodeRateLimited, "too many requests are waiting for changes; retry in a few seconds")
		}
		defer s.waiting.Add(-1)
		base := etag
		// An order with no payment yet changes only by its own
		// notifications; one with payments also with each block of its
		// network (confirmations), and so does one on a network whose
		// mempool paywatch watches (a sighting can come back into view
		// without a change of its own).
		network := ""
		if n := s.cfg.Network(o.Network); len(o.Transfers) > 0 || (n != nil && n.Family == paywatch.FamilyBitcoin) {
			network = o.Network
		}
		changed, stop := s.changes.Subscribe(o.ID, network)
		defer stop()
		// Read again now that changes are heard: one that landed between
		// the first read and the subscription is not missed.
		if _, body, etag, err = s.renderOrder(r, id); err != nil {
			return err
		}
		timer := time.NewTimer(wait)
		defer timer.Stop()
		last := time.Now()
	poll:
		for etag == base {
			select {
			case <-r.Context().Done():
				return nil
			case <-timer.C:
				break poll
			case <-s.draining:
				break poll
			case <-changed:
				// At most one read per minRereadGap; a wait that ends
				// meanwhile (or a shutdown) answers what was read last
				// (the next request sees the change at once).
				select {
				case <-time.After(time.Until(last.Add(minRereadGap))):
				case <-timer.C:
					break poll
				case <-s.draining:
					break poll
				case <-r.Context().Done():
					return nil
				}
				last = time.Now()
				if _, body, etag, err = s.renderOrder(r, id); err != nil {
					return err
				}
			}
		}
	}
	w.Header().Set("ETag", etag)
	w.Header().Set("Cache-Control", "no-cache")
	if inm != "" && matches(inm, etag) {
		w.WriteHeader(http.StatusNotModified)
		return nil
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	return nil
}
