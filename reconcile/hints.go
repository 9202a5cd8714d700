package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// A customer's tx hash ("I've paid" with tx_hash) is a claim, never proof.
// It may link only a transfer this order could have matched anyway
// (eligibility), that is matched to no other order, that is not exactly the
// pay amount of another order it could have paid (an exact match always
// wins over a claim), and that no other order waiting for about that amount
// may be owed. Any other claim is rejected on the order's timeline, with
// why, and pays nothing; an operator can still attach by hand. Two claims
// on one payment contest it: neither order gets it.
//
// A pass decides the claims whose transaction a watcher has recorded, oldest
// first and at most HintsPerPass of them; it never waits on a node. Claims
// whose transaction is not recorded yet are looked up on the node beside the
// passes (LookUpHints), each with its own backoff, and given up when the
// order's monitoring window ends.
const (
	HintsPerPass = 200
	// LookupsPerRound bounds the node look-ups of one LookUpHints round,
	// and LookupConcurrency how many run at once.
	LookupsPerRound   = 32
	LookupConcurrency = 4
	// MaxLookups is how often one claim is looked up on the node, at
	// FirstLookupRetry, doubling up to MaxLookupRetry, before it is left to
	// the scanner (66 minutes from the first to the last).
	MaxLookups       = 12
	FirstLookupRetry = 5 * time.Second
	MaxLookupRetry   = 15 * time.Minute
	LookupTimeout    = 10 * time.Second
)

// hintPending is the state of a claim not decided yet (then "linked" or
// "rejected").
const hintPending = "pending"

// Why claims are rejected besides the eligibility rules.
const (
	whyMatchedElsewhere = "it is matched to another order"
	whyExactElsewhere   = "it is the exact pay amount of another order"
	whyContested        = "another order claims the same payment: an operator decides"
	whyWaitingElsewhere = "another order waiting for a payment of about this amount may be owed it: an operator decides"
	whyClosed           = "the order is closed"
	whyNotFound         = "no payment with this transaction hash was on the chain when the order's monitoring window ended"
)

// claimBudget is what a pass may still decide of claims: those whose
// transaction is recorded, and those given up at their window's end.
type claimBudget struct{ recorded, expired int }

func newClaimBudget() claimBudget { return claimBudget{recorded: HintsPerPass, expired: HintsPerPass} }

// followHints decides pending claims whose transaction has a live transfer
// recorded: it links what they may link and rejects the rest. A claim whose
// transfers a reorg orphaned stays pending: they may come back. It takes up
// what is left of budget, oldest first, and counts them off it: a pass runs
// its steps in rounds, and its claims are HintsPerPass in all (and as many
// given up at their window's end). It returns the transfers linked and the
// claims decided.
func (r *Reconciler) followHints(ctx context.Context, now time.Time, budget *claimBudget) (linked, decided int64, err error) {
	// Claims whose order's window ended with nothing live recorded: given up.
	var expired []string
	if budget.expired > 0 {
		if err := r.db.SelectContext(ctx, &expired, `SELECT o.id FROM orders o
			WHERE o.hint_state = 'pending' AND o.monitor_until < $1
				AND NOT EXISTS (SELECT 1 FROM transfers t WHERE t.network = o.network AND t.tx_hash = o.tx_hash_hint
					AND t.state <> 'orphaned')
			ORDER BY o.customer_marked_paid_at, o.id LIMIT $2`, now, budget.expired); err != nil {
			return 0, 0, err
		}
		budget.expired -= len(expired)
	}
	for _, id := range expired {
		if err := r.Sealer.SealTx(ctx, r.db, func(tx *sqlx.Tx) error {
			if _, err := lockOrders(ctx, tx, []string{id}); err != nil {
				return err
			}
			return rejectHint(ctx, tx, id, now, whyNotFound, nil)
		}); err != nil {
			return linked, decided, fmt.Errorf("order %s: %w", id, err)
		}
		decided++
	}
	// Claims whose transaction is recorded, oldest first. A claim of a hash
	// nothing recorded costs one index probe here. A claim that must wait
	// anyway (for its order's creation height, or for the balance check of
	// one of its transfers: followHint) is left out, so that claims waiting
	// long never take up the pass's budget.
	if budget.recorded <= 0 {
		return linked, decided, nil
	}
	var pending []string
	if err := r.db.SelectContext(ctx, &pending, `SELECT o.id FROM orders o
		WHERE o.hint_state = 'pending' AND o.created_height IS NOT NULL
			AND EXISTS (SELECT 1 FROM transfers t WHERE t.network = o.network AND t.tx_hash = o.tx_hash_hint
				AND t.state <> 'orphaned')
			AND NOT EXISTS (SELECT 1 FROM transfers t WHERE t.network = o.network AND t.tx_hash = o.tx_hash_hint
				AND t.state <> 'orphaned' AND '`+paywatch.FlagBalancePending+`' = ANY (t.flags))
		ORDER BY o.customer_marked_paid_at, o.id LIMIT $1`, budget.recorded); err != nil {
		return linked, decided, err
	}
	budget.recorded -= len(pending)
	for _, id := range pending {
		var n int64
		var done bool
		if err := r.Sealer.SealTx(ctx, r.db, func(tx *sqlx.Tx) error {
			var err error
			n, done, err = followHint(ctx, tx, id, now)
			return err
		}); err != nil {
			return linked, decided, fmt.Errorf("order %s: %w", id, err)
		}
		linked += n
		if done {
			decided++
		}
	}
	return linked, decided, nil
}

// lockOrders locks orders in id order (the one order every path takes locks
// in) and returns their statuses.
func lockOrders(ctx context.Context, tx *sqlx.Tx, ids []string) (map[string]paywatch.Status, error) {
	var rows []struct {
		ID     string `db:"id"`
		Status string `db:"status"`
	}
	if err := tx.SelectContext(ctx, &rows, `SELECT id, status FROM orders WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`,
		pq.Array(ids)); err != nil {
		return nil, fmt.Errorf("lock orders: %w", err)
	}
	out := make(map[string]paywatch.Status, len(rows))
	for _, r := range rows {
		out[r.ID] = paywatch.Status(r.Status)
	}
	return out, nil
}

// claimed is a live transfer of a claimed transaction, with what the claim
// rules say of it.
type claimed struct {
	ID             string         `db:"id"`
	OrderID        *string        `db:"order_id"`
	MatchKind      *string        `db:"match_kind"`
	Flags          pq.StringArray `db:"flags"`
	Fails          pq.BoolArray   `db:"fails"` // per eligibility rule: does it fail?
	ExactElsewhere bool           `db:"exact_elsewhere"`
	// WaitingElsewhere: another order on the shared address, holding no
	// payment yet, could be paid by it and asks about as much.
	WaitingElsewhere bool `db:"waiting_elsewhere"`
}

// why says why the transfer cannot be linked to the order (it is free: no
// order holds it), or "".
func (c *claimed) why() string {
	for i, fails := range c.Fails {
		if fails {
			if eligibility[i].name == ruleFlags {
				return "it is flagged " + strings.Join(c.Flags, ", ")
			}
			return eligibility[i].why
		}
	}
	if c.ExactElsewhere {
		return whyExactElsewhere
	}
	return ""
}

// claimQuery reads the live transfers of an order's claimed transaction,
// locked (after the orders), with each eligibility rule evaluated.
var claimQuery = func() string {
	fails := make([]string, len(eligibility))
	for i, e := range eligibility {
		fails[i] = "NOT coalesce((" + aliases(e.cond, "t", "o") + "), false)"
	}
	return `SELECT t.id, t.order_id, t.match_kind, t.flags,
		ARRAY[` + strings.Join(fails, ", ") + `] AS fails,
		` + exactElsewhere("t", "o") + ` AS exact_elsewhere,
		` + waitingElsewhere("t", "o") + ` AS waiting_elsewhere
	FROM orders o JOIN transfers t ON t.network = o.network AND t.tx_hash = o.tx_hash_hint
	WHERE o.id = $1 AND t.state <> 'orphaned' ORDER BY t.idx, t.id FOR UPDATE OF t`
}()

// followHint decides one claim inside tx. It returns the transfers linked
// and whether the claim is decided.
//
// A claim that could link the transfer (eligible, no other order's exact
// amount) but finds it linked by another customer's claim contests it:
// neither order gets it. It goes back to the inbox flagged ambiguous, and
// each of the two orders that holds no other payment is disputed
// ambiguous, for an operator to decide. Whoever claims first wins nothing.
// Nor does a claim on a payment that another order, waiting for about that
// amount with nothing received, could be owed: the claim links nothing and
// its order is disputed ambiguous.
func followHint(ctx context.Context, tx *sqlx.Tx, orderID string, now time.Time) (int64, bool, error) {
	// The orders involved are locked first, in id order: this one, and any
	// another claim linked this transaction's transfers to.
	var others []string
	if err := tx.SelectContext(ctx, &others, `SELECT DISTINCT t.order_id FROM orders o
		JOIN transfers t ON t.network = o.network AND t.tx_hash = o.tx_hash_hint
		WHERE o.id = $1 AND t.state <> 'orphaned' AND t.match_kind = 'hint' AND t.order_id <> o.id`, orderID); err != nil {
		return 0, false, err
	}
	statuses, err := lockOrders(ctx, tx, append([]string{orderID}, others...))
	if err != nil {
		return 0, false, err
	}
	var o struct {
		State  *string `db:"hint_state"`
		Height *int64  `db:"created_height"`
	}
	if err := tx.GetContext(ctx, &o, `SELECT hint_state, created_height FROM orders WHERE id = $1`, orderID); err != nil {
		return 0, false, err
	}
	if o.State == nil || *o.State != hintPending {
		return 0, false, nil // decided meanwhile
	}
	if o.Height == nil {
		return 0, false, nil // the network's height at creation is not known yet: wait for the scanner
	}
	var found []claimed
	if err := tx.SelectContext(ctx, &found, claimQuery, orderID); err != nil {
		return 0, false, fmt.Errorf("read the claimed transaction: %w", err)
	}
	if len(found) == 0 {
		return 0, false, nil // orphaned meanwhile: wait
	}
	for _, c := range found {
		if slices.Contains(c.Flags, paywatch.FlagBalancePending) {
			return 0, false, nil // its balance check has not run yet: wait for the verdict
		}
	}
	status := statuses[orderID]
	var link []string
	var contested []claimed
	already, waiting, first := false, false, ""
	for _, c := range found {
		byClaim := c.MatchKind != nil && *c.MatchKind == "hint"
		why := c.why()
		switch {
		case c.OrderID != nil && *c.OrderID == orderID:
			already = true
		case c.OrderID != nil && !byClaim:
			first = cmp.Or(first, whyMatchedElsewhere)
		case why != "":
			first = cmp.Or(first, why) // a claim that could not link it contests nothing
		case c.OrderID != nil:
			other, locked := statuses[*c.OrderID]
			if !locked {
				return 0, false, nil // linked by a claim meanwhile: decide next pass
			}
			if other.Terminal() || status.Terminal() {
				first = cmp.Or(first, whyMatchedElsewhere)
				continue
			}
			contested = append(contested, c)
		case status.Terminal():
			first = cmp.Or(first, whyClosed)
		case c.WaitingElsewhere:
			waiting = true
			first = cmp.Or(first, whyWaitingElsewhere)
		default:
			link = append(link, c.ID)
		}
	}
	if len(contested) > 0 {
		return 0, true, contest(ctx, tx, orderID, contested, now)
	}
	if waiting && len(link) == 0 && !already {
		if err := rejectHint(ctx, tx, orderID, now, whyWaitingElsewhere, found); err != nil {
			return 0, false, err
		}
		return 0, true, disputeIfBare(ctx, tx, []string{orderID}, now)
	}
	if len(link) == 0 && !already {
		return 0, true, rejectHint(ctx, tx, orderID, now, first, found)
	}
	if len(link) > 0 {
		res, err := tx.ExecContext(ctx, `UPDATE transfers SET order_id = $2, match_kind = 'hint', updated_at = $3
			WHERE id = ANY($1) AND order_id IS NULL`, pq.Array(link), orderID, now)
		if err != nil {
			return 0, false, fmt.Errorf("link: %w", err)
		}
		if n, _ := res.RowsAffected(); n != int64(len(link)) {
			return 0, false, fmt.Errorf("linked %d of %d locked transfers", n, len(link))
		}
		for _, id := range link {
			if err := orders.AppendEvent(ctx, tx, orderID, now, orders.EventTransferMatched, "", "", "reconciler",
				map[string]string{"transfer_id": id, "by": "tx_hash_hint"}); err != nil {
				return 0, false, err
			}
		}
		if err := queueReviews(ctx, tx, now, []string{orderID}); err != nil {
			return 0, false, err
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET hint_state = 'linked', updated_at = $2 WHERE id = $1`,
		orderID, now); err != nil {
		return 0, false, err
	}
	return int64(len(link)), true, nil
}

// contest takes transfers two claims name from the order the first claim
// linked them to, inside tx (both orders locked): they go back to the
// inbox, flagged ambiguous (the ledger reposts them there), both timelines
// say so, and each order left without a payment is disputed ambiguous.
func contest(ctx context.Context, tx *sqlx.Tx, orderID string, contested []claimed, now time.Time) error {
	involved := []string{orderID}
	for _, c := range contested {
		if _, err := tx.ExecContext(ctx, `UPDATE transfers SET order_id = NULL, match_kind = NULL, ledger_dirty = true,
			flags = array_append(array_remove(flags, 'ambiguous'), 'ambiguous'), updated_at = $2 WHERE id = $1`, c.ID, now); err != nil {
			return fmt.Errorf("unlink a contested transfer: %w", err)
		}
		for _, pair := range [][2]string{{orderID, *c.OrderID}, {*c.OrderID, orderID}} {
			if err := orders.AppendEvent(ctx, tx, pair[0], now, orders.EventHintContested, "", "", "reconciler",
				map[string]string{"transfer_id": c.ID, "other_order": pair[1]}); err != nil {
				return err
			}
		}
		involved = append(involved, *c.OrderID)
	}
	if err := rejectHint(ctx, tx, orderID, now, whyContested, contested); err != nil {
		return err
	}
	if err := queueReviews(ctx, tx, now, involved); err != nil {
		return err
	}
	return disputeIfBare(ctx, tx, involved, now)
}

// disputeIfBare disputes as ambiguous each of the locked orders that holds
// no live payment and may move so.
func disputeIfBare(ctx context.Context, tx *sqlx.Tx, involved []string, now time.Time) error {
	var bare []struct {
		ID     string  `db:"id"`
		Status string  `db:"status"`
		Reason *string `db:"dispute_reason"`
	}
	if err := tx.SelectContext(ctx, &bare, `SELECT o.id, o.status, o.dispute_reason FROM orders o WHERE o.id = ANY($1)
		AND NOT EXISTS (SELECT 1 FROM transfers t WHERE t.order_id = o.id AND t.state <> 'orphaned')
		ORDER BY o.id`, pq.Array(involved)); err != nil {
		return err
	}
	for _, o := range bare {
		from := paywatch.Status(o.Status)
		if (o.Reason != nil && paywatch.Reason(*o.Reason) == paywatch.ReasonAmbiguous) ||
			!paywatch.CanMove(from, paywatch.StatusDisputed, paywatch.ReasonAmbiguous, paywatch.ActorReconciler) {
			continue
		}
		if err := disputeTx(ctx, tx, o.ID, from, paywatch.ReasonAmbiguous, now, nil); err != nil {
			return err
		}
	}
	return nil
}

// disputeTx moves a locked order to disputed with its event and webhook.
func disputeTx(ctx context.Context, tx *sqlx.Tx, orderID string, from paywatch.Status, reason paywatch.Reason, now time.Time, detail map[string]any) error {
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'disputed', dispute_reason = $2, settled_at = NULL, updated_at = $3
		WHERE id = $1`, orderID, string(reason), now); err != nil {
		return err
	}
	if detail == nil {
		detail = map[string]any{}
	}
	detail["reason"] = reason
	if err := orders.AppendEvent(ctx, tx, orderID, now, orders.EventStatusChanged, from, paywatch.StatusDisputed,
		"reconciler", detail); err != nil {
		return err
	}
	return orders.EnqueueWebhook(ctx, tx, orderID, now, orders.WebhookDisputed)
}

// rejectHint records that a claim pays nothing, and why, on a locked order
// whose claim is pending. A transaction that paid the shop in another asset
// disputes an order that has no payment yet as wrong_asset, so that an
// operator looks at it.
func rejectHint(ctx context.Context, tx *sqlx.Tx, orderID string, now time.Time, reason string, found []claimed) error {
	var o struct {
		Status string  `db:"status"`
		Hint   *string `db:"tx_hash_hint"`
		State  *string `db:"hint_state"`
		Live   bool    `db:"live"`
	}
	if err := tx.GetContext(ctx, &o, `SELECT status, tx_hash_hint, hint_state,
			EXISTS (SELECT 1 FROM transfers WHERE order_id = $1 AND state <> 'orphaned') AS live
		FROM orders WHERE id = $1`, orderID); err != nil {
		return err
	}
	if o.State == nil || *o.State != hintPending {
		return nil // decided meanwhile
	}
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET hint_state = 'rejected', updated_at = $2 WHERE id = $1`,
		orderID, now); err != nil {
		return err
	}
	ids := make([]string, len(found))
	for i, f := range found {
		ids[i] = f.ID
	}
	detail := map[string]any{"tx_hash": o.Hint, "why": reason, "transfers": ids}
	if err := orders.AppendEvent(ctx, tx, orderID, now, orders.EventHintRejected, "", "", "reconciler", detail); err != nil {
		return err
	}
	from := paywatch.Status(o.Status)
	if reason != reasonOf(ruleAsset) || o.Live || !paywatch.CanMove(from, paywatch.StatusDisputed, paywatch.ReasonWrongAsset, paywatch.ActorReconciler) {
		return nil
	}
	return disputeTx(ctx, tx, orderID, from, paywatch.ReasonWrongAsset, now, map[string]any{"tx_hash": o.Hint})
}

// LookUpHints runs one round of node look-ups for pending claims whose
// transaction no watcher has recorded: oldest due first, at most
// LookupsPerRound, LookupConcurrency at a time, each with its own timeout
// and, per claim, a doubling backoff up to MaxLookups. What the nodes find
// is recorded as provisional transfers; the next pass decides the claims.
// It returns how many look-ups found something.
func (r *Reconciler) LookUpHints(ctx context.Context) (int, error) {
	if r.Record == nil || len(r.Lookups) == 0 {
		return 0, nil
	}
	networks := make([]string, 0, len(r.Lookups))
	for n := range r.Lookups {
		networks = append(networks, n)
	}
	now := r.now()
	var due []struct {
		ID      string `db:"id"`
		Network string `db:"network"`
		Hash    string `db:"tx_hash_hint"`
		Lookups int    `db:"hint_lookups"`
	}
	if err := r.db.SelectContext(ctx, &due, `SELECT o.id, o.network, o.tx_hash_hint, o.hint_lookups FROM orders o
		WHERE o.hint_state = 'pending' AND o.hint_next_lookup_at <= $1 AND o.hint_lookups < $2
			AND o.monitor_until >= $1 AND o.network = ANY($3)
			AND NOT EXISTS (SELECT 1 FROM transfers t WHERE t.network = o.network AND t.tx_hash = o.tx_hash_hint)
		ORDER BY o.hint_next_lookup_at, o.id LIMIT $4`, now, MaxLookups, pq.Array(networks), LookupsPerRound); err != nil {
		return 0, fmt.Errorf("read claims to look up: %w", err)
	}
	var mu sync.Mutex
	foundAny := 0
	var errs []error
	sem := make(chan struct{}, LookupConcurrency)
	var wg sync.WaitGroup
	for _, d := range due {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			lctx, cancel := context.WithTimeout(ctx, LookupTimeout)
			found, err := r.Lookups[d.Network].LookupTx(lctx, d.Hash)
			cancel()
			if err == nil && len(found) > 0 {
				err = r.Record(ctx, d.Network, found)
			}
			if err != nil {
				r.log.Warn("could not look up the customer's tx hash", "order", d.ID, "tx_hash", d.Hash, "err", err)
			}
			var next *time.Time // none after the last: the scanner will find it, if it exists
			if d.Lookups+1 < MaxLookups {
				at := now.Add(lookupBackoff(d.Lookups + 1))
				next = &at
			}
			_, uerr := r.db.ExecContext(ctx, `UPDATE orders SET hint_lookups = hint_lookups + 1, hint_next_lookup_at = $2
				WHERE id = $1 AND hint_state = 'pending'`, d.ID, next)
			mu.Lock()
			defer mu.Unlock()
			if uerr != nil {
				errs = append(errs, uerr)
			}
			if err == nil && len(found) > 0 {
				foundAny++
			}
		}()
	}
	wg.Wait()
	return foundAny, errors.Join(errs...)
}

// lookupBackoff is the wait before a claim's next look-up, after n.
func lookupBackoff(n int) time.Duration {
	d := FirstLookupRetry
	for i := 1; i < n && d < MaxLookupRetry; i++ {
		d *= 2
	}
	return min(d, MaxLookupRetry)
}
