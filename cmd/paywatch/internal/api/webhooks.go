package api

import (
	"net/http"
	"slices"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/reconcile/outbox"
)

func (s *Server) listDeliveries(w http.ResponseWriter, r *http.Request, _ *config.APIKey) error {
	q, limit, err := query(r, "event_id", "order_id", "status")
	if err != nil {
		return err
	}
	f := outbox.Filter{EventID: q.Get("event_id"), OrderID: q.Get("order_id"), Status: q.Get("status"),
		Limit: limit, Cursor: q.Get("cursor")}
	if f.Status != "" && !slices.Contains(outbox.Statuses, f.Status) {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "status must be one of pending, delivered, failed, refused")
	}
	list, next, err := s.webhooks.Deliveries(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, newList(list, next))
	return nil
}

func (s *Server) redeliver(w http.ResponseWriter, r *http.Request, caller *config.APIKey) error {
	if err := decodeBody(w, r, &struct{}{}, true); err != nil {
		return err
	}
	d, err := s.webhooks.Redeliver(r.Context(), r.PathValue("id"), caller.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}
