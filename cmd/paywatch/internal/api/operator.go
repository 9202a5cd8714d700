package api

import (
	"net/http"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/reconcile/orders"
)

func (s *Server) listTransfers(w http.ResponseWriter, r *http.Request, _ *config.APIKey) error {
	q, limit, err := query(r, "matched", "state", "network", "asset")
	if err != nil {
		return err
	}
	f := orders.TransferFilter{State: paywatch.TransferState(q.Get("state")), Network: q.Get("network"),
		Asset: q.Get("asset"), Limit: limit, Cursor: q.Get("cursor")}
	switch m := q.Get("matched"); m {
	case "":
	case "true", "false":
		v := m == "true"
		f.Matched = &v
	default:
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "matched must be true or false")
	}
	switch f.State {
	case "", paywatch.TransferSeen, paywatch.TransferConfirmed, paywatch.TransferOrphaned:
	default:
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "state must be seen, confirmed or orphaned")
	}
	if err := s.checkNetwork(f.Network); err != nil {
		return err
	}
	list, next, err := s.store.ListTransfers(r.Context(), f)
	if err != nil {
		return err
	}
	views := make([]transferView, len(list))
	for i := range list {
		views[i] = s.transferView(&list[i])
	}
	writeJSON(w, http.StatusOK, newList(views, next))
	return nil
}

func (s *Server) getTransfer(w http.ResponseWriter, r *http.Request, _ *config.APIKey) error {
	t, err := s.store.GetTransfer(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.transferView(t))
	return nil
}

type networkView struct {
	Name       string  `json:"name"`
	Family     string  `json:"family"`
	Head       *int64  `json:"head"`
	Cursor     *int64  `json:"cursor"`
	CursorHash *string `json:"cursor_hash"`
	LagBlocks  *int64  `json:"lag_blocks"`
	LastError  *string `json:"last_error"`
	// Health is "ok", "error" (the last step failed; retrying), "halted"
	// (a reorg too deep: an operator must act) or "not_started".
	Health    string     `json:"health"`
	UpdatedAt *time.Time `json:"updated_at"`
	// Addresses: per extended public key (address per order), the run of
	// unpaid derived addresses against the configured gap limit.
	Addresses []gapView `json:"addresses,omitempty"`
}

type gapView struct {
	Asset string `json:"asset"`
	// XPub is the key shortened: the whole key would show every address
	// and balance of the shop to anyone holding an operator key.
	XPub     string `json:"xpub"`
	Given    int64  `json:"addresses_given"`
	LastPaid *int64 `json:"last_paid_index"`
	Unpaid   int64  `json:"unpaid_run"`
	// UnpaidAtLeast: the run is longer than the walk back bounds (100,000
	// addresses); unpaid_run is that bound.
	UnpaidAtLeast bool `json:"unpaid_run_at_least,omitempty"`
	GapLimit      int  `json:"gap_limit"`
	// OverGapLimit: a wallet restored from the key with this gap limit
	// would not find the next payment.
	OverGapLimit bool `json:"over_gap_limit"`
}

func (s *Server) listNetworks(w http.ResponseWriter, r *http.Request, _ *config.APIKey) error {
	statuses, err := s.chains.Statuses(r.Context())
	if err != nil {
		return err
	}
	views := make([]networkView, 0, len(s.cfg.Networks))
	for _, n := range s.cfg.Networks {
		v := networkView{Name: n.Name, Family: string(n.Family), Health: "not_started"}
		if st, ok := statuses[n.Name]; ok {
			switch {
			case st.Halted:
				v.Health = "halted"
			case st.LastError != nil:
				v.Health = "error"
			default:
				v.Health = "ok"
			}
			v.Head, v.Cursor, v.CursorHash, v.LastError = st.Head, st.Cursor, st.CursorHash, st.LastError
			at := st.UpdatedAt.UTC()
			v.UpdatedAt = &at
			if st.Head != nil && st.Cursor != nil {
				lag := max(*st.Head-*st.Cursor, 0)
				v.LagBlocks = &lag
			}
		}
		for _, a := range n.Assets {
			if a.XPub == "" {
				continue
			}
			g, err := s.store.Gap(r.Context(), n.Name, a.XPub)
			if err != nil {
				return err
			}
			gv := gapView{Asset: a.Symbol, XPub: shortKey(a.XPub), Given: g.Given, Unpaid: g.Unpaid, UnpaidAtLeast: g.AtLeast, GapLimit: a.GapLimit,
				OverGapLimit: a.GapLimit > 0 && g.Unpaid >= int64(a.GapLimit)}
			if g.LastPaid >= 0 {
				gv.LastPaid = &g.LastPaid
			}
			v.Addresses = append(v.Addresses, gv)
		}
		views = append(views, v)
	}
	writeJSON(w, http.StatusOK, newList(views, ""))
	return nil
}

type attachRequest struct {
	OrderID string `json:"order_id"`
	Note    string `json:"note"`
}

func (s *Server) attachTransfer(w http.ResponseWriter, r *http.Request, caller *config.APIKey) error {
	var body attachRequest
	if err := decodeBody(w, r, &body, false); err != nil {
		return err
	}
	if body.OrderID == "" {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "order_id is required")
	}
	id := r.PathValue("id")
	if err := s.ops.Attach(r.Context(), id, body.OrderID, body.Note, caller.Name); err != nil {
		return err
	}
	s.nudge()
	t, err := s.store.GetTransfer(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.transferView(t))
	return nil
}

type resolveRequest struct {
	Outcome string `json:"outcome"`
	Note    string `json:"note"`
}

func (s *Server) resolveOrder(w http.ResponseWriter, r *http.Request, caller *config.APIKey) error {
	var body resolveRequest
	if err := decodeBody(w, r, &body, false); err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := s.ops.Resolve(r.Context(), id, paywatch.Status(body.Outcome), body.Note, caller.Name); err != nil {
		return err
	}
	s.nudge()
	o, err := s.store.Get(r.Context(), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.orderView(o))
	return nil
}

type balanceView struct {
	Account string `json:"account"`
	Network string `json:"network"`
	Asset   string `json:"asset"`
	Balance string `json:"balance"`
}

func (s *Server) ledgerBalances(w http.ResponseWriter, r *http.Request, _ *config.APIKey) error {
	q, _, err := query(r, "account_prefix")
	if err != nil {
		return err
	}
	balances, err := s.ledger.Balances(r.Context(), q.Get("account_prefix"))
	if err != nil {
		return err
	}
	views := make([]balanceView, len(balances))
	for i, b := range balances {
		views[i] = balanceView{Account: b.Account, Network: b.Network, Asset: b.Asset,
			Balance: s.formatter(b.Network, b.Asset)(b.Amount)}
	}
	writeJSON(w, http.StatusOK, newList(views, ""))
	return nil
}

// shortKey shortens an extended public key to tell it apart from others.
func shortKey(k string) string {
	if len(k) <= 20 {
		return k
	}
	return k[:12] + "…" + k[len(k)-6:]
}
