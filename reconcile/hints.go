package reconcile

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// A customer's tx hash ("I've paid" with tx_hash) is a claim, never proof.
// It may link only a transfer this order could have matched anyway
// (eligibility), that is matched to no other order, and that is not exactly
// the pay amount of another open order it could pay (an exact match always
// wins over a claim). Any other claim is rejected on the order's timeline,
// with why, and pays nothing; an operator can still attach by hand.
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
	// the scanner (about an hour and a half in all).
	MaxLookups       = 12
	FirstLookupRetry = 5 * time.Second
	MaxLookupRetry   = 15 * time.Minute
	LookupTimeout    = 10 * time.Second
)

// Hint states.
const (
	hintPending  = "pending"
	hintLinked   = "linked"
	hintRejected = "rejected"
)

// Why claims are rejected besides the eligibility rules.
const (
	whyMatchedElsewhere = "it is matched to another order"
	whyExactElsewhere   = "it is the exact pay amount of another order"
	whyClosed           = "the order is closed"
	whyNotFound         = "no transaction with this hash paid a watched address before the order's monitoring window ended"
)

// followHints decides pending claims whose transaction is recorded: it
// links what they may link and rejects the rest. It returns the transfers
// linked and the claims decided.
func (r *Reconciler) followHints(ctx context.Context, now time.Time) (linked, decided int64, err error) {
	// Claims whose order's window ended with nothing recorded: given up.
	var expired []string
	if err := r.db.SelectContext(ctx, &expired, `SELECT o.id FROM orders o
		WHERE o.hint_state = 'pending' AND o.monitor_until < $1
			AND NOT EXISTS (SELECT 1 FROM transfers t WHERE t.network = o.network AND t.tx_hash = o.tx_hash_hint)
		ORDER BY o.customer_marked_paid_at, o.id LIMIT $2`, now, HintsPerPass); err != nil {
		return 0, 0, err
	}
	for _, id := range expired {
		if err := pg.Tx(ctx, r.db, func(tx *sqlx.Tx) error {
			return rejectHint(ctx, tx, id, now, whyNotFound, nil)
		}); err != nil {
			return linked, decided, fmt.Errorf("order %s: %w", id, err)
		}
		decided++
	}
	// Claims whose transaction is recorded, oldest first. A claim of a hash
	// nothing recorded costs one index probe here.
	var pending []string
	if err := r.db.SelectContext(ctx, &pending, `SELECT o.id FROM orders o
		WHERE o.hint_state = 'pending'
			AND EXISTS (SELECT 1 FROM transfers t WHERE t.network = o.network AND t.tx_hash = o.tx_hash_hint)
		ORDER BY o.customer_marked_paid_at, o.id LIMIT $1`, HintsPerPass); err != nil {
		return linked, decided, err
	}
	for _, id := range pending {
		var n int64
		var done bool
		if err := pg.Tx(ctx, r.db, func(tx *sqlx.Tx) error {
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

// claimed is a transfer of a claimed transaction, with what the claim rules
// say of it.
type claimed struct {
	ID             string         `db:"id"`
	OrderID        *string        `db:"order_id"`
	Asset          string         `db:"asset"`
	To             string         `db:"to_address"`
	Amount         string         `db:"amount"`
	Flags          pq.StringArray `db:"flags"`
	Fails          pq.BoolArray   `db:"fails"` // per eligibility rule: does it fail?
	ExactElsewhere bool           `db:"exact_elsewhere"`
}

// why says why the transfer cannot be linked to the order, or "".
func (c *claimed) why(orderID string) string {
	switch {
	case c.OrderID != nil && *c.OrderID != orderID:
		return whyMatchedElsewhere
	case c.OrderID != nil:
		return ""
	}
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

// claimQuery reads the transfers of an order's claimed transaction, locked
// (after the order), with each eligibility rule evaluated.
var claimQuery = func() string {
	fails := make([]string, len(eligibility))
	for i, e := range eligibility {
		fails[i] = "NOT coalesce((" + aliases(e.cond, "t", "o") + "), false)"
	}
	return `SELECT t.id, t.order_id, t.asset, t.to_address, t.amount::text AS amount, t.flags,
		ARRAY[` + strings.Join(fails, ", ") + `] AS fails,
		` + exactElsewhere("t", "o") + ` AS exact_elsewhere
	FROM orders o JOIN transfers t ON t.network = o.network AND t.tx_hash = o.tx_hash_hint
	WHERE o.id = $1 ORDER BY t.idx, t.id FOR UPDATE OF t`
}()

// followHint decides one claim inside tx. It returns the transfers linked
// and whether the claim is decided.
func followHint(ctx context.Context, tx *sqlx.Tx, orderID string, now time.Time) (int64, bool, error) {
	var o struct {
		Status string  `db:"status"`
		Hint   *string `db:"tx_hash_hint"`
		State  *string `db:"hint_state"`
	}
	if err := tx.GetContext(ctx, &o, `SELECT status, tx_hash_hint, hint_state FROM orders WHERE id = $1 FOR NO KEY UPDATE`,
		orderID); err != nil {
		return 0, false, err
	}
	if o.State == nil || *o.State != hintPending {
		return 0, false, nil // decided meanwhile
	}
	var found []claimed
	if err := tx.SelectContext(ctx, &found, claimQuery, orderID); err != nil {
		return 0, false, fmt.Errorf("read the claimed transaction: %w", err)
	}
	if len(found) == 0 {
		return 0, false, nil // not recorded after all: wait
	}
	status := paywatch.Status(o.Status)
	var link []string
	already, first := false, ""
	for i := range found {
		w := found[i].why(orderID)
		switch {
		case w == "" && found[i].OrderID != nil:
			already = true
		case w == "" && status.Terminal():
			if first == "" {
				first = whyClosed
			}
		case w == "":
			link = append(link, found[i].ID)
		case first == "":
			first = w
		}
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
				map[string]string{"transfer_id": id, "tx_hash": *o.Hint, "by": "tx_hash_hint"}); err != nil {
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

// rejectHint records that a claim pays nothing, and why. A transaction that
// paid the shop in another asset disputes an order that has no payment yet
// as wrong_asset, so that an operator looks at it.
func rejectHint(ctx context.Context, tx *sqlx.Tx, orderID string, now time.Time, reason string, found []claimed) error {
	var o struct {
		Status string  `db:"status"`
		Hint   *string `db:"tx_hash_hint"`
		Live   bool    `db:"live"`
	}
	if err := tx.GetContext(ctx, &o, `SELECT status, tx_hash_hint,
			EXISTS (SELECT 1 FROM transfers WHERE order_id = $1 AND state <> 'orphaned') AS live
		FROM orders WHERE id = $1 FOR NO KEY UPDATE`, orderID); err != nil {
		return err
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
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'disputed', dispute_reason = 'wrong_asset', updated_at = $2
		WHERE id = $1`, orderID, now); err != nil {
		return err
	}
	if err := orders.AppendEvent(ctx, tx, orderID, now, orders.EventStatusChanged, from, paywatch.StatusDisputed,
		"reconciler", map[string]any{"reason": paywatch.ReasonWrongAsset, "tx_hash": o.Hint}); err != nil {
		return err
	}
	return orders.EnqueueWebhook(ctx, tx, orderID, now, orders.WebhookDisputed)
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
			next := now.Add(lookupBackoff(d.Lookups + 1))
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
