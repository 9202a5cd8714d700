package api

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// Limits on what a storefront may send.
const (
	maxExternalID     = 128
	maxIdempotencyKey = 255
	maxMetadataBytes  = 16 << 10
	minExpiry         = time.Minute
)

type createOrderRequest struct {
	ExternalID       string          `json:"external_id"`
	Network          string          `json:"network"`
	Asset            string          `json:"asset"`
	Amount           *amountString   `json:"amount"`
	ExpiresInSeconds *int64          `json:"expires_in_seconds"`
	Metadata         json.RawMessage `json:"metadata"`
}

func validIdentifier(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || r == unicode.ReplacementChar {
			return false
		}
	}
	return true
}

func (s *Server) createOrder(w http.ResponseWriter, r *http.Request, caller *config.APIKey) error {
	var body createOrderRequest
	if err := decodeBody(w, r, &body, false); err != nil {
		return err
	}
	req, err := s.createRequest(&body)
	if err != nil {
		return err
	}
	if key := r.Header.Get("Idempotency-Key"); key != "" {
		if !validIdentifier(key, maxIdempotencyKey) {
			return paywatch.Errorf(paywatch.CodeInvalidRequest, "Idempotency-Key must be 1 to %d printable characters", maxIdempotencyKey)
		}
		req.IdempotencyScope, req.IdempotencyKey = caller.Name, key
	}
	req.Actor = caller.Name
	o, created, err := s.store.Create(r.Context(), req)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.orderView(o))
	return nil
}

// createRequest validates a create body against the configuration.
func (s *Server) createRequest(b *createOrderRequest) (orders.CreateRequest, error) {
	var req orders.CreateRequest
	if !validIdentifier(b.ExternalID, maxExternalID) {
		return req, paywatch.Errorf(paywatch.CodeInvalidRequest, "external_id is required: 1 to %d printable characters", maxExternalID)
	}
	if b.Network == "" {
		return req, paywatch.Errorf(paywatch.CodeInvalidRequest, "network is required")
	}
	n := s.cfg.Network(b.Network)
	if n == nil {
		return req, paywatch.Errorf(paywatch.CodeUnknownNetwork, "network %s is not configured (configured: %s)", quote(b.Network), s.networkNames())
	}
	if b.Asset == "" {
		return req, paywatch.Errorf(paywatch.CodeInvalidRequest, "asset is required")
	}
	a := n.Asset(b.Asset)
	if a == nil {
		var syms []string
		for _, a := range n.Assets {
			syms = append(syms, a.Symbol)
		}
		return req, paywatch.Errorf(paywatch.CodeUnknownAsset, "asset %s is not configured on %s (configured: %s)", quote(b.Asset), n.Name, strings.Join(syms, ", "))
	}
	if b.Amount == nil {
		return req, paywatch.Errorf(paywatch.CodeInvalidAmount, "amount is required, as a decimal string such as \"12.50\"")
	}
	amount, err := a.ParseAmount(string(*b.Amount))
	if err != nil {
		return req, err
	}
	expiresIn := s.cfg.Orders.DefaultExpiry
	if b.ExpiresInSeconds != nil {
		// Compared in seconds before any conversion: a huge value must not
		// overflow a duration into something that looks valid.
		lo, hi := int64(minExpiry/time.Second), int64(s.cfg.Orders.MaxExpiry/time.Second)
		if *b.ExpiresInSeconds < lo || *b.ExpiresInSeconds > hi {
			return req, paywatch.Errorf(paywatch.CodeInvalidRequest, "expires_in_seconds must be between %d and %d", lo, hi)
		}
		expiresIn = time.Duration(*b.ExpiresInSeconds) * time.Second
	}
	meta := bytes.TrimSpace(b.Metadata)
	if len(meta) > 0 && !bytes.Equal(meta, []byte("null")) {
		if meta[0] != '{' {
			return req, paywatch.Errorf(paywatch.CodeInvalidRequest, "metadata must be a JSON object")
		}
		if len(meta) > maxMetadataBytes {
			return req, paywatch.Errorf(paywatch.CodeInvalidRequest, "metadata is over %d bytes", maxMetadataBytes)
		}
	} else {
		meta = nil
	}
	return orders.CreateRequest{ExternalID: b.ExternalID, Network: n, Asset: a, Amount: amount,
		ExpiresIn: expiresIn, Metadata: meta}, nil
}

func (s *Server) networkNames() string {
	names := make([]string, len(s.cfg.Networks))
	for i, n := range s.cfg.Networks {
		names[i] = n.Name
	}
	return strings.Join(names, ", ")
}

// query reads list parameters, refusing any it does not know.
func query(r *http.Request, known ...string) (url.Values, int, error) {
	q := r.URL.Query()
	known = append(known, "limit", "cursor")
	for k, v := range q {
		if !slices.Contains(known, k) {
			return nil, 0, paywatch.Errorf(paywatch.CodeInvalidRequest, "unknown query parameter %s (known: %s)", quote(k), strings.Join(known, ", "))
		}
		if len(v) > 1 {
			return nil, 0, paywatch.Errorf(paywatch.CodeInvalidRequest, "query parameter %s is given more than once", k)
		}
		if !pg.ValidText(v[0]) {
			return nil, 0, paywatch.Errorf(paywatch.CodeInvalidRequest, "query parameter %s must be UTF-8 text without NUL bytes", k)
		}
	}
	limit := 50
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 500 {
			return nil, 0, paywatch.Errorf(paywatch.CodeInvalidRequest, "limit must be a whole number from 1 to 500")
		}
		limit = n
	}
	return q, limit, nil
}

func (s *Server) checkNetwork(name string) error {
	if name != "" && s.cfg.Network(name) == nil {
		return paywatch.Errorf(paywatch.CodeUnknownNetwork, "network %s is not configured (configured: %s)", quote(name), s.networkNames())
	}
	return nil
}

func (s *Server) listOrders(w http.ResponseWriter, r *http.Request, _ *config.APIKey) error {
	q, limit, err := query(r, "external_id", "status", "network")
	if err != nil {
		return err
	}
	f := orders.Filter{ExternalID: q.Get("external_id"), Status: paywatch.Status(q.Get("status")),
		Network: q.Get("network"), Limit: limit, Cursor: q.Get("cursor")}
	if f.Status != "" && !f.Status.Valid() {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "status %s is not one of %v", quote(string(f.Status)), paywatch.Statuses)
	}
	if err := s.checkNetwork(f.Network); err != nil {
		return err
	}
	list, next, err := s.store.List(r.Context(), f)
	if err != nil {
		return err
	}
	views := make([]orders.View, len(list))
	for i, o := range list {
		views[i] = s.orderView(o)
	}
	writeJSON(w, http.StatusOK, newList(views, next))
	return nil
}

type markPaidRequest struct {
	TxHash string `json:"tx_hash"`
}

func (s *Server) markPaid(w http.ResponseWriter, r *http.Request, caller *config.APIKey) error {
	var body markPaidRequest
	if err := decodeBody(w, r, &body, true); err != nil {
		return err
	}
	id := r.PathValue("id")
	o, err := s.store.Get(r.Context(), id)
	if err != nil {
		return err
	}
	if body.TxHash != "" {
		if err := s.checkTxHash(o.Network, body.TxHash); err != nil {
			return err
		}
	}
	o, err = s.store.MarkPaid(r.Context(), id, body.TxHash, caller.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.orderView(o))
	return nil
}

// checkTxHash checks a hash hint against the network family's format.
func (s *Server) checkTxHash(network, hash string) error {
	n := s.cfg.Network(network)
	if n == nil {
		return paywatch.Errorf(paywatch.CodeUnknownNetwork, "network %s of this order is no longer configured", quote(network))
	}
	switch n.Family {
	case paywatch.FamilyEVM:
		if !evm.ValidTxHash(hash) {
			return paywatch.Errorf(paywatch.CodeInvalidRequest, "tx_hash %s is not an EVM transaction hash (0x and 64 hex digits)", quote(hash))
		}
	case paywatch.FamilyBitcoin:
		if !bitcoin.ValidTxHash(hash) {
			return paywatch.Errorf(paywatch.CodeInvalidRequest, "tx_hash %s is not a Bitcoin transaction id (64 hex digits)", quote(hash))
		}
	}
	return nil
}

func (s *Server) cancelOrder(w http.ResponseWriter, r *http.Request, caller *config.APIKey) error {
	var body struct{}
	if err := decodeBody(w, r, &body, true); err != nil {
		return err
	}
	o, err := s.store.Cancel(r.Context(), r.PathValue("id"), caller.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.orderView(o))
	return nil
}

func (s *Server) orderEvents(w http.ResponseWriter, r *http.Request, _ *config.APIKey) error {
	events, err := s.store.Events(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	views := make([]eventView, len(events))
	for i, e := range events {
		views[i] = eventViewOf(e)
	}
	writeJSON(w, http.StatusOK, views)
	return nil
}
