package orders

import (
	"encoding/json"
	"math/big"
	"time"

	"github.com/paywatch/paywatch"
)

// View is an order as the API serves it and as webhooks carry it (README
// "HTTP API", Order): amounts as decimal strings in the asset's units.
type View struct {
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
	Transfers             []TransferView  `json:"transfers"`
	CreatedAt             time.Time       `json:"created_at"`
	ExpiresAt             time.Time       `json:"expires_at"`
	SettledAt             *time.Time      `json:"settled_at"`
	Metadata              json.RawMessage `json:"metadata"`
}

// TransferView is a transfer as listed on its order.
type TransferView struct {
	ID            string                 `json:"id"`
	TxHash        string                 `json:"tx_hash"`
	Amount        string                 `json:"amount"`
	Confirmations uint64                 `json:"confirmations"`
	State         paywatch.TransferState `json:"state"`
	BlockNumber   *uint64                `json:"block_number"` // null in the mempool
}

// Formatter renders base units of an asset on a network.
func Formatter(n *paywatch.Network, asset string) func(*big.Int) string {
	if n != nil {
		if a := n.Asset(asset); a != nil {
			return a.FormatAmount
		}
	}
	// An asset no longer configured is shown in base units.
	return func(u *big.Int) string { return u.String() }
}

// NewView renders o; n is its network's configuration (nil when the
// network is no longer configured).
func NewView(o *paywatch.Order, n *paywatch.Network) View {
	format := Formatter(n, o.Asset)
	v := View{
		ID: o.ID, ExternalID: o.ExternalID, Network: o.Network, Asset: o.Asset,
		AssetContract: optional(o.AssetContract), Amount: format(o.Amount), PayAmount: format(o.PayAmount),
		PayAddress: o.PayAddress, Status: o.Status, DisputeReason: optional(string(o.DisputeReason)),
		CustomerMarkedPaidAt: o.CustomerMarkedPaidAt, TxHashHint: optional(o.TxHashHint),
		ReceivedAmount: format(o.ReceivedAmount), Transfers: []TransferView{},
		CreatedAt: o.CreatedAt, ExpiresAt: o.ExpiresAt, SettledAt: o.SettledAt, Metadata: o.Metadata,
	}
	if n != nil && !n.UseFinalized {
		req := n.Confirmations
		v.RequiredConfirmations = &req
	}
	first := true
	for _, t := range o.Transfers {
		ot := TransferView{ID: t.ID, TxHash: t.TxHash, Amount: format(t.Amount),
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

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
