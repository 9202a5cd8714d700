package paywatch

import (
	"math/big"
	"slices"
	"strings"
	"time"
)

// Actor is who moves an order from one status to another.
type Actor string

// The actors of the lifecycle.
const (
	ActorStorefront Actor = "storefront"
	ActorReconciler Actor = "reconciler"
	ActorOperator   Actor = "operator"
)

// Transition is one move an order's status may make.
type Transition struct {
	From, To Status
	By       Actor
	// Reasons are the dispute reasons the move may carry (To disputed).
	Reasons []Reason
	// When says what causes the move, in the words of README's table.
	When string
}

// Reasons about the money that arrived, decided from the order's confirmed
// payments; the others say that no usable payment arrived.
var moneyReasons = []Reason{ReasonUnderpaid, ReasonOverpaid, ReasonLatePayment, ReasonMultiplePayments}

// AboutMoney reports whether a dispute is about the payments that arrived
// (underpaid, overpaid, late, multiple), rather than about their absence.
func (r Reason) AboutMoney() bool { return slices.Contains(moneyReasons, r) }

var redecided = append(slices.Clone(moneyReasons), ReasonOrphanedPayment)

// Lifecycle is every move an order's status may make, and nothing moves an
// order otherwise: the reconciler checks each move it decides against it,
// the invariant check holds every recorded move to it, and README's table
// of transitions is rendered from it.
var Lifecycle = []Transition{
	{StatusAwaitingPayment, StatusConfirming, ActorReconciler, nil,
		"a payment is matched and waits for its confirmations, or payments of the whole amount are seen in a mempool before expiry (`confirmations: 0`, \"payment detected\")"},
	{StatusAwaitingPayment, StatusSettled, ActorReconciler, nil,
		"a matched payment, already confirmed, is exactly `pay_amount`"},
	{StatusAwaitingPayment, StatusExpired, ActorReconciler, nil,
		"expiry passed, nothing matched, not marked paid"},
	{StatusAwaitingPayment, StatusDisputed, ActorReconciler, []Reason{ReasonNoPaymentFound},
		"marked paid, nothing found within `paid_grace`"},
	{StatusAwaitingPayment, StatusDisputed, ActorReconciler, moneyReasons,
		"matched payments, already confirmed, that do not settle it (as from confirming)"},
	{StatusAwaitingPayment, StatusDisputed, ActorReconciler, []Reason{ReasonAmbiguous},
		"a transfer could pay this order or another, or another order's customer claims the payment it claims: never a guess"},
	{StatusAwaitingPayment, StatusDisputed, ActorReconciler, []Reason{ReasonWrongAsset},
		"the customer's tx hash paid in another asset"},
	{StatusAwaitingPayment, StatusCancelled, ActorStorefront, nil,
		"the storefront cancels before any payment is matched"},
	{StatusConfirming, StatusSettled, ActorReconciler, nil,
		"every matched payment is confirmed and they sum exactly to `pay_amount`"},
	{StatusConfirming, StatusDisputed, ActorReconciler, moneyReasons,
		"confirmed, the sum differs (address per order: top-ups until expiry), a payment was mined after expiry, or two payments reached a shared address"},
	{StatusConfirming, StatusDisputed, ActorReconciler, []Reason{ReasonOrphanedPayment},
		"a reorg took every payment away"},
	{StatusConfirming, StatusDisputed, ActorReconciler, []Reason{ReasonAmbiguous},
		"two orders' customers claimed its only payment: it goes back to the inbox"},
	{StatusConfirming, StatusAwaitingPayment, ActorReconciler, nil,
		"all it had were payments seen in a mempool, replaced or dropped before any block held them, or still unmined at expiry"},
	{StatusConfirming, StatusExpired, ActorReconciler, nil,
		"as to awaiting payment, past expiry and not marked paid"},
	{StatusConfirming, StatusDisputed, ActorReconciler, []Reason{ReasonNoPaymentFound},
		"as to awaiting payment, marked paid and past `paid_grace`"},
	{StatusExpired, StatusConfirming, ActorReconciler, nil,
		"a payment is matched after expiry (late, or found late) and waits for its confirmations"},
	{StatusExpired, StatusSettled, ActorReconciler, nil,
		"a payment mined before expiry but found after it (a lagging scanner) is exactly `pay_amount`"},
	{StatusExpired, StatusDisputed, ActorReconciler, moneyReasons,
		"matched payments, already confirmed, that do not settle it: `late_payment` when mined after expiry"},
	{StatusExpired, StatusDisputed, ActorReconciler, []Reason{ReasonAmbiguous},
		"a transfer could pay this order or another, or another order's customer claims the payment it claims"},
	{StatusExpired, StatusDisputed, ActorReconciler, []Reason{ReasonWrongAsset},
		"the customer's tx hash paid in another asset"},
	{StatusDisputed, StatusSettled, ActorReconciler, nil,
		"decided again when its payments change: an exact payment confirms after `no_payment_found`, `orphaned_payment`, `wrong_asset` or `ambiguous`, or a reorg gives back what it took"},
	{StatusDisputed, StatusDisputed, ActorReconciler, redecided,
		"decided again when its payments change (a top-up, a reorg taking or giving back a part)"},
	{StatusDisputed, StatusDisputed, ActorReconciler, []Reason{ReasonAmbiguous},
		"two orders' customers claimed its only payment: it goes back to the inbox"},
	{StatusDisputed, StatusConfirming, ActorReconciler, nil,
		"after a reorg, a part payment to the order's own address before expiry waits for a top-up"},
	{StatusSettled, StatusConfirming, ActorReconciler, nil,
		"a reorg moved a payment below its confirmations, or back to the mempool while its sighting was still open (the settlement is reversed)"},
	{StatusSettled, StatusDisputed, ActorReconciler, redecided,
		"a reorg took the payment, or part of it, away, or gave back a replaced one (the settlement is reversed)"},
	{StatusDisputed, StatusSettled, ActorOperator, nil, "an operator resolves, with a note"},
	{StatusDisputed, StatusRefunded, ActorOperator, nil, "an operator resolves, with a note: the money is owed back"},
	{StatusDisputed, StatusCancelled, ActorOperator, nil, "an operator resolves, with a note: the payments return to the inbox"},
}

// CanMove reports whether the lifecycle allows by to move an order from one
// status to another, with reason when the order ends disputed.
func CanMove(from, to Status, reason Reason, by Actor) bool {
	for _, t := range Lifecycle {
		if t.From != from || t.To != to || t.By != by {
			continue
		}
		if to != StatusDisputed || slices.Contains(t.Reasons, reason) {
			return true
		}
	}
	return false
}

// Facts are what the reconciler decides an order's status on.
type Facts struct {
	Status Status
	Reason Reason
	// Shared: the pay amount tells the order apart on a shared address.
	Shared    bool
	PayAmount *big.Int
	// Accepted is what an operator accepted when settling a dispute by
	// hand; nil for orders the reconciler decides alone.
	Accepted     *big.Int
	ExpiresAt    time.Time
	MarkedPaidAt *time.Time
	PaidGrace    time.Duration
	Now          time.Time
	// Matched transfers: Live are those not orphaned, Unconfirmed the live
	// ones that do not count yet (below their confirmations, provisional,
	// or not yet in the ledger), Orphaned those a reorg took away (for
	// reports: an order decides on what it still has).
	Live, Unconfirmed, Orphaned int
	// Received sums the live transfers.
	Received *big.Int
	// Late: a live transfer was mined after the order expired.
	Late bool
	// Detached counts the payments once matched and then taken from the
	// order because, as they finally arrived, they could not pay it (a
	// reorg mined them again below its height): like Orphaned, they were
	// payments it held.
	Detached int
	// Detected counts the mempool sightings of payments to the order
	// still in the mempool (or not yet known to be mined), summing
	// DetectedAmount. They show a payment early and never pay anything.
	Detected       int
	DetectedAmount *big.Int
}

// Decide returns the status (and dispute reason) an order's facts call for.
// It is a pure function of the facts, and stable: deciding again on the
// result changes nothing. Every move it makes is in Lifecycle.
//
// The rules: the payments that count are those that arrived in their final
// form (so a reorg is decided as if the replaced transfers had never come,
// and a transfer mined again as if it had come in its new block); an order
// settles only when every live payment is confirmed and they sum exactly to
// the pay amount (or to what an operator accepted); payments seen only in
// a mempool, of the whole pay amount and before expiry, show the order
// confirming and pay nothing, and are withdrawn when replaced or dropped;
// a dispute about money
// is decided again whenever the payments change; cancelled and refunded
// orders are closed.
func Decide(f Facts) (Status, Reason) {
	same := func() (Status, Reason) { return f.Status, f.Reason }
	if f.Status == StatusCancelled || f.Status == StatusRefunded {
		return same()
	}
	if f.Unconfirmed > 0 {
		if f.Status == StatusDisputed {
			return same() // decided again once they count
		}
		return StatusConfirming, ""
	}
	acceptedNothing := f.Accepted != nil && f.Accepted.Sign() == 0
	if f.Live == 0 && !acceptedNothing {
		// Payment detected: sightings in a mempool of the whole amount,
		// before expiry, hold the order confirming (a settled order's
		// payment a reorg sent back to the mempool waits again).
		target := f.PayAmount
		if f.Accepted != nil {
			target = f.Accepted
		}
		sighted := f.Detected > 0 && f.DetectedAmount != nil && f.DetectedAmount.Cmp(target) >= 0 && f.Now.Before(f.ExpiresAt)
		switch {
		case sighted && (f.Status == StatusAwaitingPayment || f.Status == StatusConfirming || f.Status == StatusSettled):
			return StatusConfirming, ""
		case f.Status == StatusConfirming && f.Orphaned == 0 && f.Detached == 0:
			// It never held a payment: all it had were sightings, now
			// replaced, dropped, short or past expiry. As if they had
			// never come.
			f.Status = StatusAwaitingPayment
			return Decide(f)
		}
	}
	if f.Live == 0 && !acceptedNothing {
		switch {
		case f.Status == StatusConfirming || f.Status == StatusSettled || (f.Status == StatusDisputed && f.Reason.AboutMoney()):
			// It had payments, and a reorg took them all away (orphaned,
			// or mined again where they cannot pay it).
			return StatusDisputed, ReasonOrphanedPayment
		case f.Status == StatusAwaitingPayment && f.MarkedPaidAt != nil && !f.Now.Before(f.MarkedPaidAt.Add(f.PaidGrace)):
			return StatusDisputed, ReasonNoPaymentFound
		case f.Status == StatusAwaitingPayment && f.MarkedPaidAt == nil && !f.Now.Before(f.ExpiresAt):
			return StatusExpired, ""
		}
		return same()
	}
	target := f.PayAmount
	if f.Accepted != nil {
		target = f.Accepted
	} else {
		switch {
		case f.Shared && f.Live > 1:
			return StatusDisputed, ReasonMultiplePayments
		case f.Late:
			return StatusDisputed, ReasonLatePayment
		}
	}
	switch received := f.Received; {
	case received.Cmp(target) == 0:
		return StatusSettled, ""
	case received.Cmp(target) > 0:
		return StatusDisputed, ReasonOverpaid
	case !f.Shared && f.Accepted == nil && f.Now.Before(f.ExpiresAt):
		return StatusConfirming, "" // an address of its own: a top-up may come
	}
	return StatusDisputed, ReasonUnderpaid
}

// LifecycleTable renders Lifecycle as the Markdown table README shows.
func LifecycleTable() string {
	var b strings.Builder
	b.WriteString("| from | to | by | when |\n| --- | --- | --- | --- |\n")
	for _, t := range Lifecycle {
		to := string(t.To)
		if len(t.Reasons) > 0 {
			rs := make([]string, len(t.Reasons))
			for i, r := range t.Reasons {
				rs[i] = "`" + string(r) + "`"
			}
			to += " " + strings.Join(rs, ", ")
		}
		b.WriteString("| " + string(t.From) + " | " + to + " | " + string(t.By) + " | " + t.When + " |\n")
	}
	return b.String()
}
