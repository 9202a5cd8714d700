package paywatch

import (
	"encoding/json"
	"math/big"
	"time"
)

// Status is where an order dossier stands in its lifecycle.
type Status string

// The order statuses; paywatch.Lifecycle says how they follow each other.
const (
	StatusAwaitingPayment Status = "awaiting_payment"
	StatusConfirming      Status = "confirming"
	StatusSettled         Status = "settled"
	StatusDisputed        Status = "disputed"
	StatusExpired         Status = "expired"
	StatusCancelled       Status = "cancelled"
	StatusRefunded        Status = "refunded"
)

// Statuses lists every status, in lifecycle order.
var Statuses = []Status{StatusAwaitingPayment, StatusConfirming, StatusSettled,
	StatusDisputed, StatusExpired, StatusCancelled, StatusRefunded}

// Valid reports whether s is a known status.
func (s Status) Valid() bool {
	for _, v := range Statuses {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether no further payment can change the order.
func (s Status) Terminal() bool {
	return s == StatusSettled || s == StatusCancelled || s == StatusRefunded
}

// Reason explains why an order is disputed.
type Reason string

// The dispute reasons.
const (
	ReasonUnderpaid        Reason = "underpaid"
	ReasonOverpaid         Reason = "overpaid"
	ReasonLatePayment      Reason = "late_payment"
	ReasonNoPaymentFound   Reason = "no_payment_found"
	ReasonMultiplePayments Reason = "multiple_payments"
	ReasonOrphanedPayment  Reason = "orphaned_payment"
	ReasonWrongAsset       Reason = "wrong_asset"
	ReasonAmbiguous        Reason = "ambiguous"
)

// Order is a payment dossier: what the customer must pay, where, and what
// has happened since.
type Order struct {
	ID                   string
	ExternalID           string
	Network              string
	Asset                string
	AssetContract        string
	Amount               *big.Int // requested, base units
	PayAmount            *big.Int // what the customer must send, base units
	PayAddress           string
	Status               Status
	DisputeReason        Reason // empty unless disputed
	CustomerMarkedPaidAt *time.Time
	TxHashHint           string
	Metadata             json.RawMessage
	CreatedAt            time.Time
	ExpiresAt            time.Time
	MonitorUntil         time.Time // expiry plus the monitoring window
	SettledAt            *time.Time
	// ReceivedAmount is the sum of matched transfers that are not orphaned
	// (in blocks: a payment seen only in a mempool is not received yet).
	ReceivedAmount *big.Int
	Transfers      []Transfer
}

// Event is one entry of an order's timeline.
type Event struct {
	At         time.Time
	Type       string
	FromStatus Status
	ToStatus   Status
	Actor      string
	Detail     json.RawMessage
}

// TransferState is where a transfer stands on chain.
type TransferState string

// The transfer states.
const (
	TransferSeen      TransferState = "seen"
	TransferConfirmed TransferState = "confirmed"
	TransferOrphaned  TransferState = "orphaned"
	// TransferMempool is a payment seen in a mempool, in no block yet: it
	// shows on its order and pays nothing.
	TransferMempool TransferState = "mempool"
)

// Flags on transfers. (The chain adapters set theirs: dust, and on EVM
// networks balance_pending until the balance check has run, then
// balance_mismatch or balance_unchecked.) Only balance_unchecked lets a
// transfer match an order by itself.
const (
	// FlagAmbiguous: the transfer could pay more than one order, or two
	// customers claimed it; an operator decides.
	FlagAmbiguous = "ambiguous"
	// FlagHeld: the transfer went back to the inbox (an operator's cancel,
	// or a change that took it from its order); only an operator places it.
	FlagHeld = "held"
	// FlagBalancePending: a token transfer recorded before its balance
	// check (the fake-deposit guard) ran. It matches nothing and never
	// confirms until the check's verdict replaces the flag.
	FlagBalancePending = "balance_pending"
)

// Transfer is one incoming movement of value seen on chain.
type Transfer struct {
	ID            string
	Network       string
	Asset         string
	AssetContract string
	TxHash        string
	Index         int64 // log index, tx index or output index
	From          string
	To            string
	Amount        *big.Int
	BlockNumber   uint64
	BlockHash     string
	Confirmations uint64
	State         TransferState
	OrderID       string // empty when unmatched
	Flags         []string
	FirstSeenAt   time.Time
}
