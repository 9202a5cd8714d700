package reconcile

import (
	"strconv"
	"strings"
)

// A transfer t can pay an order o only when every one of these holds. The
// matching statements, the check of customers' tx hash claims and the
// invariant check all build their SQL from this one list, and a rejected
// claim says which condition failed (why).
//
// The height bound is one a customer cannot game: created_height is the
// height the network had reached, as far as the scanner had recorded it,
// when the order was created, so a transfer mined before the order existed
// never pays it (a victim's short payment waiting in the inbox cannot be
// claimed by creating an order for exactly that amount). Nor does anything
// paywatch had recorded before the order was created, whatever its block
// (a look-up's answer from a block the scanner has not reached). Block
// timestamps are not the bound (Bitcoin's can be hours off);
// earliest_block_time only narrows the case of a head recorded late.
var eligibility = []rule{
	{ruleAsset, "it paid another network or asset",
		`{t}.network = {o}.network AND {t}.asset = {o}.asset AND {t}.asset_contract = {o}.asset_contract`},
	{ruleAddress, "it paid another address", `{t}.to_address = {o}.pay_address`},
	{ruleLive, "its block was replaced by a reorg", `{t}.state <> 'orphaned'`},
	// dust, balance_mismatch (the fake deposit guard), ambiguous and any
	// flag paywatch does not know never pay; balance_unchecked (a pruned
	// node could not check) does. Nor does balance_pending (the check has
	// not run yet): a transfer is matched once its verdict is in.
	{ruleFlags, "it is flagged", `{t}.flags <@ ARRAY['balance_unchecked']::text[]`},
	{ruleAfterCreation, "it was mined before the order was created",
		`{o}.created_height IS NOT NULL AND {t}.block_number > {o}.created_height
		AND ({t}.block_time IS NULL OR {t}.block_time >= {o}.earliest_block_time)`},
	{ruleRecordedAfter, "paywatch had recorded it before the order was created",
		`{t}.first_seen_at >= {o}.created_at`},
	{ruleInWindow, "it was mined after the order's monitoring window ended",
		`coalesce({t}.block_time, {t}.first_seen_at) <= {o}.monitor_until`},
}

// recheckFlags is the flags rule for a transfer already matched: one that
// a look-up recorded and the scanner has since found is balance_pending
// until its check runs, and keeps its order meanwhile (it confirms nothing
// until then; a mismatch takes it back).
const recheckFlags = `array_remove({t}.flags, 'balance_pending') <@ ARRAY['balance_unchecked']::text[]`

// rule is one condition of eligibility: its SQL with {t} and {o} standing
// for the transfer's and the order's aliases, and why a transfer failing
// it cannot pay the order.
type rule struct{ name, why, cond string }

// The rules' names.
const (
	ruleAsset         = "asset"
	ruleAddress       = "address"
	ruleLive          = "live"
	ruleFlags         = "flags"
	ruleAfterCreation = "after_creation"
	ruleRecordedAfter = "recorded_after"
	ruleInWindow      = "in_window"
)

// reasonOf returns why a transfer failing the rule called name cannot pay.
func reasonOf(name string) string { return ruleNamed(name).why }

// eligible is the SQL condition that transfer alias t can pay order alias o.
func eligible(t, o string) string {
	conds := make([]string, len(eligibility))
	for i, e := range eligibility {
		conds[i] = "(" + aliases(e.cond, t, o) + ")"
	}
	return strings.Join(conds, " AND ")
}

// blockRules is the SQL condition that transfer t's block is one order o
// can be paid from (mined after the order was created, before its window
// ended): the rules a reorg can change by mining a transaction again.
func blockRules(t, o string) string {
	return "(" + aliases(ruleNamed(ruleAfterCreation).cond, t, o) + ") AND (" + aliases(ruleNamed(ruleInWindow).cond, t, o) + ")"
}

// ruleNamed returns the eligibility rule called name.
func ruleNamed(name string) rule {
	for _, r := range eligibility {
		if r.name == name {
			return r
		}
	}
	panic("reconcile: no eligibility rule " + name)
}

func aliases(cond, t, o string) string {
	return strings.NewReplacer("{t}", t, "{o}", o).Replace(cond)
}

// openStatuses are the statuses in which an order takes payments.
const openStatuses = `('awaiting_payment', 'confirming', 'expired', 'disputed')`

// candidates pairs unmatched transfers (t) with the orders (o) they may
// pay: eligible, on an open order, and either exactly its pay amount on a
// shared address or any amount to its own address. $2 bounds how far back
// (first seen) transfers are considered. The two receiving modes are joined
// apart so that each join is on equalities.
var candidates = `
	FROM (
		SELECT t.id AS tid, o.id AS oid, 'amount' AS kind FROM transfers t
		JOIN orders o ON o.network = t.network AND o.asset = t.asset AND o.asset_contract = t.asset_contract
			AND o.pay_address = t.to_address AND o.pay_amount = t.amount AND o.unique_k IS NOT NULL
		WHERE t.order_id IS NULL AND t.first_seen_at >= $2 AND o.status IN ` + openStatuses + ` AND ` + eligible("t", "o") + `
		UNION ALL
		SELECT t.id, o.id, 'address' FROM transfers t
		JOIN orders o ON o.network = t.network AND o.asset = t.asset AND o.asset_contract = t.asset_contract
			AND o.pay_address = t.to_address AND o.unique_k IS NULL
		WHERE t.order_id IS NULL AND t.first_seen_at >= $2 AND o.status IN ` + openStatuses + ` AND ` + eligible("t", "o") + `
	) pairs`

// exactElsewhere is the SQL condition that transfer t is exactly the pay
// amount of an order other than o that it could have paid: an exact match
// always wins over a customer's claim. Whatever that order's status: a
// second payment to a settled order, or one to a cancelled order, is its
// customer's money to give back, not another customer's to claim.
func exactElsewhere(t, o string) string {
	return `EXISTS (SELECT 1 FROM orders o2 WHERE o2.id <> ` + o + `.id AND o2.network = ` + t + `.network
		AND o2.asset = ` + t + `.asset AND o2.pay_address = ` + t + `.to_address AND o2.pay_amount = ` + t + `.amount
		AND o2.unique_k IS NOT NULL AND ` + eligible(t, "o2") + `)`
}

// ClaimTolerance is how far (a fraction of its pay amount) another order's
// pay amount may be from a claimed payment for that order to count as
// possibly owed it: a claim never links a payment such an order, waiting
// with nothing received, could be owed.
const ClaimTolerance = 0.10

// waitingElsewhere is the SQL condition that transfer t, on a shared
// address, could pay another order than o that waits for a payment of
// about its amount and holds none (confirming included: a payment seen in a
// mempool holds nothing).
//
// The amount is bounded twice: first by a range of pay amounts an index
// (orders_open_shared_window_idx) can walk, then by the tolerance itself.
// |amount − pay| ≤ pay × tol holds only for amount / (1 + tol) ≤ pay ≤
// amount / (1 − tol); the floor and the ceiling keep every integer pay
// amount of that range, however the divisions round. Without the range,
// a claim read every order its shared address ever had.
func waitingElsewhere(t, o string) string {
	tol := strconv.FormatFloat(ClaimTolerance, 'f', -1, 64)
	return `EXISTS (SELECT 1 FROM orders o3 WHERE o3.id <> ` + o + `.id AND o3.network = ` + t + `.network
		AND o3.asset = ` + t + `.asset AND o3.pay_address = ` + t + `.to_address AND o3.unique_k IS NOT NULL
		AND o3.status IN ('awaiting_payment', 'confirming', 'expired', 'disputed')
		AND o3.pay_amount BETWEEN floor(` + t + `.amount / (1 + ` + tol + `)) AND ceil(` + t + `.amount / (1 - ` + tol + `))
		AND abs(` + t + `.amount - o3.pay_amount) <= o3.pay_amount * ` + tol + `
		AND NOT EXISTS (SELECT 1 FROM transfers t3 WHERE t3.order_id = o3.id AND t3.state <> 'orphaned')
		AND ` + eligible(t, "o3") + `)`
}
