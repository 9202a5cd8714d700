package reconcile

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// factsRow is one candidate of transitionCandidates.
type factsRow struct {
	ID        string     `db:"id"`
	OrderID   *string    `db:"oid"` // nil when another transaction held the order
	Status    *string    `db:"status"`
	Reason    *string    `db:"dispute_reason"`
	PayAmount *string    `db:"pay_amount"`
	Accepted  *string    `db:"accepted_amount"`
	Shared    *bool      `db:"shared"`
	ExpiresAt *time.Time `db:"expires_at"`
	MarkedAt  *time.Time `db:"customer_marked_paid_at"`
	Network   *string    `db:"network"`
	Asset     *string    `db:"asset"`
	Live      int        `db:"live"`
	Unconf    int        `db:"unconfirmed"`
	Orphaned  int        `db:"orphaned"`
	Received  string     `db:"received"`
	Late      bool       `db:"late"`
	Detected  int        `db:"detected"`
	Detached  int        `db:"detached"`
	DetAmount string     `db:"detected_amount"`
}

func (f *factsRow) facts(now time.Time, grace time.Duration) (paywatch.Facts, error) {
	pay, ok := new(big.Int).SetString(*f.PayAmount, 10)
	received, ok2 := new(big.Int).SetString(f.Received, 10)
	detected, ok3 := new(big.Int).SetString(f.DetAmount, 10)
	if !ok || !ok2 || !ok3 {
		return paywatch.Facts{}, fmt.Errorf("order %s: amounts %q, %q and %q are not integers", f.ID, *f.PayAmount, f.Received, f.DetAmount)
	}
	facts := paywatch.Facts{Status: paywatch.Status(*f.Status), Shared: *f.Shared, PayAmount: pay,
		ExpiresAt: *f.ExpiresAt, MarkedPaidAt: f.MarkedAt, PaidGrace: grace, Now: now,
		Live: f.Live, Unconfirmed: f.Unconf, Orphaned: f.Orphaned, Received: received, Late: f.Late,
		Detached: f.Detached, Detected: f.Detected, DetectedAmount: detected}
	if f.Reason != nil {
		facts.Reason = paywatch.Reason(*f.Reason)
	}
	if f.Accepted != nil {
		a, ok := new(big.Int).SetString(*f.Accepted, 10)
		if !ok {
			return paywatch.Facts{}, fmt.Errorf("order %s: accepted amount %q is not an integer", f.ID, *f.Accepted)
		}
		facts.Accepted = a
	}
	return facts, nil
}

// transitions decides the candidates in batches of r.Batch, walking them by
// id, and applies each batch in one transaction: status changes with their
// events and webhooks, settlements and their reversals, refund adjustments.
//
// Two batches are in flight at once: as soon as a batch has read (and
// locked) its candidates, the next one starts reading the orders after its
// last, while it applies its own. Their orders are disjoint (each walks ids
// above the one before), so neither waits for the other, and a pass of
// thousands of orders keeps two database sessions busy instead of one.
//
// A batch that fails writes nothing. When it had read its candidates, they
// are tried again in halves, each half in a transaction of its own, down
// to single orders: one order whose move fails holds back no other, and
// the others still move in batches (unless maxReported orders failed alone
// and none moved: see retry.gaveUp). The walk goes on past them, and the
// pass reports the orders that failed alone (the first maxReported, and
// how many more).
func (r *Reconciler) transitions(ctx context.Context, now time.Time) (int64, error) {
	var total int64
	var failed []error
	var applying <-chan batchDone // the batch before, still applying
	finish := func() {
		if applying == nil {
			return
		}
		d := <-applying
		applying = nil
		total += d.n
		if d.err != nil && d.count > 1 {
			// In halves; the batch after (orders above its last) may be in
			// flight meanwhile.
			r.log.Warn("a batch of transitions failed; trying its orders again in halves", "orders", d.count, "err", d.err)
			var rt retry
			if _, stopped := r.halves(ctx, now, &rt, d.after, d.count); stopped && rt.gaveUp() {
				r.log.Warn("gave up trying a failed batch's orders alone: none moved", "failed_alone", len(rt.failed))
			}
			total += rt.moved
			failed = append(failed, rt.failed...)
			return
		}
		if d.err != nil {
			failed = append(failed, d.err)
		}
	}
	after := ""
	for {
		read, done := r.startBatch(ctx, now, after, r.Batch)
		rd := <-read
		finish()
		applying = done
		if rd.err != nil || rd.count < r.Batch {
			finish()
			break
		}
		after = rd.last
	}
	if len(failed) == 0 {
		return total, nil
	}
	err := errors.Join(failed[:min(len(failed), maxReported)]...)
	if len(failed) > maxReported {
		err = fmt.Errorf("%w\nand %d more", err, len(failed)-maxReported)
	}
	return total, fmt.Errorf("move orders: %w", err)
}

// maxReported bounds the failures a pass's error lists.
const maxReported = 10

// retry is the state of one failed batch tried again in halves.
type retry struct {
	moved  int64
	failed []error
}

// gaveUp says when a retry stops: maxReported orders failed alone and
// none moved. The cause is then not theirs (the database, a bug every
// move meets), and trying each of thousands alone would cost two
// transactions an order; the rest waits for the next pass.
func (rt *retry) gaveUp() bool { return len(rt.failed) >= maxReported && rt.moved == 0 }

// halves moves the next count candidates after id after (what a failed
// batch read) as two batches. See try.
func (r *Reconciler) halves(ctx context.Context, now time.Time, rt *retry, after string, count int) (reached string, stopped bool) {
	first := count / 2
	reached, stopped = r.try(ctx, now, rt, after, first)
	if stopped {
		return reached, true
	}
	return r.try(ctx, now, rt, reached, count-first)
}

// try moves the next count candidates after id after in one transaction
// and, should that fail, in halves (down to single orders), noting in rt
// what moved and which orders failed alone. It returns the id it reached,
// and whether it stopped: candidates could not be read (the database, the
// context), or rt gave up. The rest is then left for the next pass.
func (r *Reconciler) try(ctx context.Context, now time.Time, rt *retry, after string, count int) (string, bool) {
	if rt.gaveUp() {
		return after, true
	}
	read, done := r.startBatch(ctx, now, after, count)
	rd, d := <-read, <-done
	rt.moved += d.n
	switch {
	case rd.err != nil:
		rt.failed = append(rt.failed, rd.err)
		return after, true
	case rd.count == 0:
		return after, false
	case d.err == nil:
		return rd.last, false
	case rd.count == 1:
		rt.failed = append(rt.failed, d.err)
		return rd.last, false
	}
	return r.halves(ctx, now, rt, after, rd.count)
}

// batchRead says what a batch of transitions read: how many candidates,
// the last one's id, or why it could not.
type batchRead struct {
	count int
	last  string
	err   error
}

// batchDone says how many orders a batch moved, or why it failed (nothing
// of it is then written); with what it read (count candidates after id
// after).
type batchDone struct {
	n     int64
	err   error
	count int
	after string
}

// startBatch runs a batch of up to limit transitions after id after in a
// transaction of its own: read says when its candidates are read and
// locked, done when it has committed or failed. Each channel gets exactly
// one value.
func (r *Reconciler) startBatch(ctx context.Context, now time.Time, after string, limit int) (<-chan batchRead, <-chan batchDone) {
	read, done := make(chan batchRead, 1), make(chan batchDone, 1)
	go func() {
		var n int64
		var rd batchRead
		sent := false
		err := r.Sealer.SealTx(ctx, r.db, func(tx *sqlx.Tx) error {
			var rows []factsRow
			if err := tx.SelectContext(ctx, &rows, transitionCandidates, now, r.PaidGrace.Seconds(), after, limit); err != nil {
				return fmt.Errorf("read candidates: %w", err)
			}
			rd = batchRead{count: len(rows)}
			if len(rows) > 0 {
				rd.last = rows[len(rows)-1].ID
			}
			read <- rd
			sent = true
			var err error
			n, err = r.decide(ctx, tx, now, rows)
			return err
		})
		if !sent {
			read <- batchRead{err: err}
		}
		if err != nil {
			n = 0
		}
		done <- batchDone{n: n, err: err, count: rd.count, after: after}
	}()
	return read, done
}

// decide applies paywatch.Decide to locked candidates inside tx.
func (r *Reconciler) decide(ctx context.Context, tx *sqlx.Tx, now time.Time, rows []factsRow) (int64, error) {
	var ids, from, to, reasons, causes []string
	var settle []ledger.OrderAmount
	var unsettle, refunded []string
	for i := range rows {
		row := &rows[i]
		if row.OrderID == nil {
			continue // held by another transaction; its review waits
		}
		f, err := row.facts(now, r.PaidGrace)
		if err != nil {
			return 0, err
		}
		if f.Status == paywatch.StatusRefunded {
			refunded = append(refunded, row.ID)
			continue
		}
		status, reason := paywatch.Decide(f)
		if status == f.Status && reason == f.Reason {
			continue
		}
		if !paywatch.CanMove(f.Status, status, reason, paywatch.ActorReconciler) {
			return 0, fmt.Errorf("order %s: decided %s/%s → %s/%s, which the lifecycle does not allow",
				row.ID, f.Status, f.Reason, status, reason)
		}
		cause := ""
		switch {
		case f.Status == paywatch.StatusConfirming && status != paywatch.StatusConfirming && f.Live == 0 && f.Orphaned == 0 &&
			f.Detached == 0:
			// It was held by mempool sightings alone.
			cause = "payment_withdrawn"
			if !now.Before(f.ExpiresAt) {
				cause = "unconfirmed_at_expiry"
			}
		case status == paywatch.StatusConfirming && f.Live == 0:
			cause = "payment_detected"
		}
		if f.Status == paywatch.StatusSettled {
			cause = "reorg"
			unsettle = append(unsettle, row.ID)
		}
		if status == paywatch.StatusSettled {
			settle = append(settle, ledger.OrderAmount{OrderID: row.ID, Network: *row.Network, Asset: *row.Asset, Amount: f.Received})
		}
		ids, from, to = append(ids, row.ID), append(from, string(f.Status)), append(to, string(status))
		reasons, causes = append(reasons, string(reason)), append(causes, cause)
	}
	var moved []struct {
		ID string `db:"id"`
		To string `db:"to_status"`
	}
	if len(ids) > 0 {
		if err := tx.SelectContext(ctx, &moved, applyTransitions, now, pq.Array(ids), pq.Array(from), pq.Array(to),
			pq.Array(reasons), pq.Array(causes)); err != nil {
			return 0, fmt.Errorf("apply transitions: %w", err)
		}
		if len(moved) != len(ids) {
			return 0, fmt.Errorf("applied %d of %d transitions of locked orders", len(moved), len(ids))
		}
	}
	// Settling moves what the order's account holds to revenue: the
	// payments counted are only those already attributed in the ledger.
	if err := ledger.Unsettle(ctx, tx, now, unsettle); err != nil {
		return 0, err
	}
	if err := ledger.Settle(ctx, tx, now, settle); err != nil {
		return 0, err
	}
	for _, id := range refunded {
		if err := adjustRefund(ctx, tx, now, id); err != nil {
			return 0, err
		}
	}
	// The webhooks last, each with its order as the batch leaves it.
	events := make([]orders.Event, len(moved))
	for i, m := range moved {
		events[i] = orders.Event{OrderID: m.ID, Type: "order." + m.To}
	}
	if err := r.Sealer.Enqueue(ctx, tx, now, events); err != nil {
		return 0, err
	}
	return int64(len(moved)), nil
}

// adjustRefund keeps what is owed back for a refunded order equal to the
// payments that arrived: a reorg that takes one away takes its refund with
// it, one that gives it back owes it again.
//
// Each adjustment has a ref of its own, numbered: the rounds of a pass share
// its time, and a second adjustment in one pass must not be dropped as a
// duplicate of the first. The order is locked: no one else adjusts it
// meanwhile.
func adjustRefund(ctx context.Context, tx *sqlx.Tx, now time.Time, orderID string) error {
	var n int
	if err := tx.GetContext(ctx, &n, `SELECT count(*) FROM ledger_entries WHERE order_id = $1 AND kind = $2`,
		orderID, ledger.KindRefundAdjustment); err != nil {
		return fmt.Errorf("count refund adjustments of %s: %w", orderID, err)
	}
	moved, err := ledger.Sweep(ctx, tx, now, orderID, ledger.KindRefundAdjustment,
		orderID+"@"+now.Format("20060102150405.000000")+"#"+strconv.Itoa(n), ledger.RefundsOwed)
	if err != nil || len(moved) == 0 {
		return err
	}
	detail := map[string]string{}
	for _, b := range moved {
		detail["owed_change_units:"+b.Network+":"+b.Asset] = b.Amount.String()
	}
	return orders.AppendEvent(ctx, tx, orderID, now, orders.EventRefundAdjusted, "", "", "reconciler", detail)
}

// CheckDecisions reports every order whose status is not what
// paywatch.Decide says of its facts now: a pass has yet to run, or a change
// to its payments was missed. Tests and the simulation run it right after a
// pass, where it must find nothing.
func (r *Reconciler) CheckDecisions(ctx context.Context) error {
	now := r.now()
	var errs []error
	for after := ""; ; {
		var rows []factsRow
		if err := r.db.SelectContext(ctx, &rows, allFacts, after, 5000); err != nil {
			return fmt.Errorf("read facts: %w", err)
		}
		for i := range rows {
			f, err := rows[i].facts(now, r.PaidGrace)
			if err != nil {
				return err
			}
			if s, reason := paywatch.Decide(f); s != f.Status || reason != f.Reason {
				errs = append(errs, fmt.Errorf("order %s is %s/%s; its payments call for %s/%s (%d live, %d waiting, %d orphaned, %s received)",
					rows[i].ID, f.Status, f.Reason, s, reason, f.Live, f.Unconfirmed, f.Orphaned, f.Received))
			}
		}
		if len(rows) < 5000 {
			return errors.Join(errs...)
		}
		after = rows[len(rows)-1].ID
	}
}
