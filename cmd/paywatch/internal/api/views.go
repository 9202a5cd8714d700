package api

import (
	"encoding/json"
	"math/big"
	"time"

	"github.com/paywatch/paywatch"
)

type orderView struct {
	ID                    string          `json:"id"`
	ExternalID            string          `json:"external_id"`
	Network               string          `json:"network"`
	Asset                 string          `json:"asset"`
	AssetContract         *string         `json:"asset_contract"`
	Amount                string          `json:"amount"`
	PayAmount             string          `json:"pay_amount"`
	PayAddress            string          `json:"pay_address"`
	Status                paywatch.Status `json:"status"`
	DisputeReason         *string         `json:"dispute_reason"`
	CustomerMarkedPaidAt  *time.Time      `json:"customer_marked_paid_at"`
	TxHashHint            *string         `json:"tx_hash_hint"`
	ReceivedAmount        string          `json:"received_amount"`
	Confirmations         uint64          `json:"confirmations"`
	RequiredConfirmations *int            `json:"required_confirmations"`
	Transfers             []orderTransfer `json:"transfers"`
	CreatedAt             time.Time       `json:"created_at"`
	ExpiresAt             time.Time       `json:"expires_at"`
	SettledAt             *time.Time      `json:"settled_at"`
	Metadata              json.RawMessage `json:"metadata"`
}

type orderTransfer struct {
	ID            string                 `json:"id"`
	TxHash        string                 `json:"tx_hash"`
	Amount        string                 `json:"amount"`
	Confirmations uint64                 `json:"confirmations"`
	State         paywatch.TransferState `json:"state"`
	BlockNumber   *uint64                `json:"block_number"` // null in the mempool
}

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
	if n := s.cfg.Network(network); n != nil {
		if a := n.Asset(asset); a != nil {
			return a.FormatAmount
		}
	}
	return func(u *big.Int) string { return u.String() }
}

func (s *Server) orderView(o *paywatch.Order) orderView {
	format := s.formatter(o.Network, o.Asset)
	v := orderView{
		ID: o.ID, ExternalID: o.ExternalID, Network: o.Network, Asset: o.Asset,
		AssetContract: optional(o.AssetContract), Amount: format(o.Amount), PayAmount: format(o.PayAmount),
		PayAddress: o.PayAddress, Status: o.Status, DisputeReason: optional(string(o.DisputeReason)),
		CustomerMarkedPaidAt: o.CustomerMarkedPaidAt, TxHashHint: optional(o.TxHashHint),
		ReceivedAmount: format(o.ReceivedAmount), Transfers: []orderTransfer{},
		CreatedAt: o.CreatedAt, ExpiresAt: o.ExpiresAt, SettledAt: o.SettledAt, Metadata: o.Metadata,
	}
	if n := s.cfg.Network(o.Network); n != nil && !n.UseFinalized {
		req := n.Confirmations
		v.RequiredConfirmations = &req
	}
	first := true
	for _, t := range o.Transfers {
		ot := orderTransfer{ID: t.ID, TxHash: t.TxHash, Amount: format(t.Amount),
			Confirmations: t.Confirmations, State: t.State}
		if t.State != paywatch.TransferMempool {
			ot.BlockNumber = &t.BlockNumber
		}
		v.Transfers = append(v.Transfers, ot)
		if t.State == paywatch.TransferOrphaned {
			continue
		}
		if first || t.Confirmations < v.Confirmations {
			v.Confirmations = t.Confirmations
			first = false
		}
	}
	if len(v.Metadata) == 0 {
		v.Metadata = json.RawMessage("null")
	}
	return v
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
