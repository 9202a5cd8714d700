package api

import (
	"encoding/json"
	"math/big"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/reconcile/orders"
)

type transferView struct {
	ID            string                 `json:"id"`
	Network       string                 `json:"network"`
	Asset         string                 `json:"asset"`
	AssetContract *string                `json:"asset_contract"`
	TxHash        string                 `json:"tx_hash"`
	Index         int64                  `json:"index"`
	From          *string                `json:"from"`
	To            string                 `json:"to"`
	Amount        string                 `json:"amount"`
	BlockNumber   uint64                 `json:"block_number"`
	BlockHash     string                 `json:"block_hash"`
	Confirmations uint64                 `json:"confirmations"`
	State         paywatch.TransferState `json:"state"`
	OrderID       *string                `json:"order_id"`
	Flags         []string               `json:"flags"`
	FirstSeenAt   time.Time              `json:"first_seen_at"`
}

type eventView struct {
	At         time.Time       `json:"at"`
	Type       string          `json:"type"`
	FromStatus *string         `json:"from_status"`
	ToStatus   *string         `json:"to_status"`
	Actor      string          `json:"actor"`
	Detail     json.RawMessage `json:"detail"`
}

type listView[T any] struct {
	Data       []T     `json:"data"`
	NextCursor *string `json:"next_cursor"`
}

func newList[T any](data []T, next string) listView[T] {
	if data == nil {
		data = []T{}
	}
	return listView[T]{Data: data, NextCursor: optional(next)}
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// formatter renders base units of a configured asset; an asset no longer in
// the configuration is shown in base units.
func (s *Server) formatter(network, asset string) func(*big.Int) string {
	return orders.Formatter(s.cfg.Network(network), asset)
}

func (s *Server) orderView(o *paywatch.Order) orders.View {
	return orders.NewView(o, s.cfg.Network(o.Network))
}

func (s *Server) transferView(t *paywatch.Transfer) transferView {
	return transferView{
		ID: t.ID, Network: t.Network, Asset: t.Asset, AssetContract: optional(t.AssetContract), TxHash: t.TxHash,
		Index: t.Index, From: optional(t.From), To: t.To, Amount: s.formatter(t.Network, t.Asset)(t.Amount),
		BlockNumber: t.BlockNumber, BlockHash: t.BlockHash, Confirmations: t.Confirmations, State: t.State,
		OrderID: optional(t.OrderID), Flags: t.Flags, FirstSeenAt: t.FirstSeenAt,
	}
}

func eventViewOf(e paywatch.Event) eventView {
	v := eventView{At: e.At, Type: e.Type, FromStatus: optional(string(e.FromStatus)),
		ToStatus: optional(string(e.ToStatus)), Actor: e.Actor, Detail: e.Detail}
	if len(v.Detail) == 0 {
		v.Detail = json.RawMessage("null")
	}
	return v
}
