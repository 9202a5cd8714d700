package reconcile_test

// A seeded randomized simulation of the money path, in the spirit of
// TigerBeetle's VOPR: a driver mixes order creation; exact, inexact, split,
// stray and late payments; honest and hostile tx hash claims; cancels,
// resolutions and attaches; mining, reorgs at random depths, a lying node;
// clock jumps past expiries and windows; lagging scanners and reconciler
// restarts — on the real PostgreSQL, with the real scanner, store,
// reconciler and ledger over chains held in memory. After every pass it
// checks every invariant, that every order is where its payments say, and
// that no payment meant for one order was claimed by another.
//
//	go test ./reconcile -run TestSimulation                       the CI seeds
//	go test ./reconcile -run TestSimulation -sim.seed=7 -v         replay one seed
//	go test ./reconcile -run TestSimulation -sim.seeds=200 -sim.steps=3000 -timeout 0   a long run

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

var (
	simSeed  = flag.Uint64("sim.seed", 0, "simulate this seed (0: the seeds CI runs)")
	simSeeds = flag.Int("sim.seeds", 0, "simulate this many seeds from -sim.seed on")
	simSteps = flag.Int("sim.steps", 0, "steps per seed (0: CI's length)")
	simTrace = flag.Bool("sim.trace", false, "print every action of a failing seed, not only the last ones")
)

// The seeds and length CI runs.
const (
	ciSeeds = 4
	ciSteps = 600
)

func TestSimulation(t *testing.T) {
	first, n, steps := uint64(1), ciSeeds, ciSteps
	if *simSeed != 0 {
		first, n = *simSeed, 1
	}
	if *simSeeds > 0 {
		n = *simSeeds
	}
	if *simSteps > 0 {
		steps = *simSteps
	}
	total := 0
	start := time.Now()
	for seed := first; seed < first+uint64(n); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			s := newSim(t, seed)
			s.run(steps)
			total += s.steps
		})
	}
	t.Logf("simulated %d seeds from %d, %d steps, in %s", n, first, total, time.Since(start).Round(time.Millisecond))
}

type sim struct {
	t       *testing.T
	seed    uint64
	rnd     *rand.Rand
	db      *sqlx.DB
	clock   *reconciletest.Clock
	store   *orders.Store
	scans   *scan.Store
	rec     *reconcile.Reconciler
	op      *reconcile.Operator
	nets    []*simNet
	orders  []*simOrder
	byID    map[string]*simOrder
	pays    []*simPay
	byTx    map[string]*simPay
	history []string
	steps   int
}

type simNet struct {
	network *paywatch.Network
	asset   *paywatch.Asset
	chain   *reconciletest.Chain
	scanner *scan.Scanner
}

type simOrder struct {
	n  int
	o  *paywatch.Order
	sn *simNet
}

// simPay is a payment the driver made, and the order it was meant for
// (nil for a stray payment nobody's order asked for).
type simPay struct {
	tx       *reconciletest.Tx
	sn       *simNet
	intended *simOrder
}

var simLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func newSim(t *testing.T, seed uint64) *sim {
	db := pgtest.New(t)
	s := &sim{t: t, seed: seed, rnd: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), db: db,
		clock: reconciletest.NewClock(time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)),
		byID:  map[string]*simOrder{}, byTx: map[string]*simPay{}}
	s.store = orders.NewStore(db, 6*time.Hour, reconciletest.Wallets(t))
	s.store.Now = s.clock.Now
	s.store.Rand = s.rnd.IntN
	s.scans = scan.NewStore(db)
	s.scans.Now = s.clock.Now
	s.op = reconcile.NewOperator(db)
	s.op.Now = s.clock.Now
	usdt := &paywatch.Asset{Network: "simevm", Symbol: "USDT", Contract: reconciletest.USDTContract, Decimals: 6,
		Mode: paywatch.ModeShared, Addresses: []string{reconciletest.Shop}, UniqueStep: big.NewInt(1), UniqueSlots: 6,
		Dust: big.NewInt(100)}
	btc := &paywatch.Asset{Network: "simbtc", Symbol: "BTC", Native: true, Decimals: 8, Mode: paywatch.ModePerOrder,
		XPub: reconciletest.VPub, Dust: new(big.Int)}
	for _, n := range []*paywatch.Network{
		{Name: "simevm", Family: paywatch.FamilyEVM, Confirmations: 3, Assets: []*paywatch.Asset{usdt}},
		{Name: "simbtc", Family: paywatch.FamilyBitcoin, Chain: "regtest", Confirmations: 2, Assets: []*paywatch.Asset{btc}},
	} {
		n.PollInterval = time.Millisecond
		chain := reconciletest.NewChain(s.rnd, s.clock.Now)
		sc := scan.NewScanner(n, chain, s.scans, simLog)
		sc.MaxBatch = 5
		s.nets = append(s.nets, &simNet{network: n, asset: n.Assets[0], chain: chain, scanner: sc})
	}
	s.restartReconciler()
	for _, sn := range s.nets { // both networks scanned from their genesis
		s.sync(sn)
	}
	return s
}

// restartReconciler starts a new reconciler: all its state is in the
// database.
func (s *sim) restartReconciler() {
	s.rec = reconcile.New(s.db, simLog, time.Hour, 4*24*time.Hour)
	s.rec.Now = s.clock.Now
	s.rec.Batch = 7
	s.rec.Lookups = map[string]reconcile.TxLookup{}
	for _, sn := range s.nets {
		s.rec.Lookups[sn.network.Name] = sn.chain
	}
	s.rec.Record = s.scans.Record
}

func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	msg := fmt.Sprintf(format, args...)
	format, args = "%s%s", []any{msg, s.dump(msg)}
	tail := s.history
	if !*simTrace {
		tail = tail[max(len(tail)-40, 0):]
	}
	s.t.Fatalf("seed %d, step %d: %s\nlast actions:\n  %s\nreplay: go test ./reconcile -run 'TestSimulation' -sim.seed=%d -sim.steps=%d -v",
		s.seed, s.steps, fmt.Sprintf(format, args...), strings.Join(tail, "\n  "), s.seed, s.steps)
}

// dump describes the orders a failure names, with their transfers, as the
// database holds them.
func (s *sim) dump(msg string) string {
	var b strings.Builder
	for _, id := range regexp.MustCompile(`ord_[a-z0-9]+`).FindAllString(msg, 5) {
		var o struct {
			Status, Reason, Pay, Created, Until, Accepted, Hint string
		}
		_ = s.db.QueryRow(`SELECT status, coalesce(dispute_reason, ''), pay_amount::text, coalesce(created_height::text, '?'),
			monitor_until::text, coalesce(accepted_amount::text, ''), coalesce(hint_state, '') FROM orders WHERE id = $1`, id).
			Scan(&o.Status, &o.Reason, &o.Pay, &o.Created, &o.Until, &o.Accepted, &o.Hint)
		n := 0
		if so := s.byID[id]; so != nil {
			n = so.n
		}
		fmt.Fprintf(&b, "\n  order %d %s: %s %s pay %s created at height %s window until %s accepted %q claim %q", n, id,
			o.Status, o.Reason, o.Pay, o.Created, o.Until, o.Accepted, o.Hint)
		rows, err := s.db.Query(`SELECT tx_hash, amount::text, block_number, state, coalesce(match_kind, ''), provisional, ledger_dirty,
			attribution_entry IS NOT NULL, coalesce(block_time::text, '') FROM transfers WHERE order_id = $1 ORDER BY block_number`, id)
		if err != nil {
			continue
		}
		for rows.Next() {
			var tx, amount, state, kind, at string
			var block int64
			var prov, dirty, attributed bool
			_ = rows.Scan(&tx, &amount, &block, &state, &kind, &prov, &dirty, &attributed, &at)
			fmt.Fprintf(&b, "\n    %s %s in %d (%s) %s by %s provisional=%v dirty=%v attributed=%v", short(tx), amount, block, at, state, kind, prov, dirty, attributed)
		}
		rows.Close()
		var reviews int
		_ = s.db.QueryRow(`SELECT count(*) FROM order_reviews WHERE order_id = $1`, id).Scan(&reviews)
		fmt.Fprintf(&b, "\n    %d reviews queued", reviews)
	}
	return b.String()
}

func (s *sim) note(format string, args ...any) {
	s.history = append(s.history, fmt.Sprintf("%4d %s ", s.steps, s.clock.Now().Format("01-02 15:04:05"))+fmt.Sprintf(format, args...))
}

func (s *sim) ctx() context.Context { return context.Background() }

// pick returns a random element of a non-empty slice.
func pick[T any](s *sim, xs []T) T { return xs[s.rnd.IntN(len(xs))] }

func (s *sim) net() *simNet { return pick(s, s.nets) }

func (s *sim) run(steps int) {
	actions := []struct {
		weight int
		name   string
		do     func()
	}{
		{14, "create", s.create},
		{12, "pay exact", func() { s.payFor(0) }},
		{5, "pay inexact", func() { s.payFor(1 + s.rnd.IntN(3)) }},
		{4, "pay split", s.paySplit},
		{3, "pay stray", s.payStray},
		{3, "claim a stray's amount", s.claimStray},
		{5, "mark paid, honest", func() { s.markPaid("honest") }},
		{4, "mark paid, hostile", func() { s.markPaid("hostile") }},
		{2, "mark paid, random hash", func() { s.markPaid("random") }},
		{2, "mark paid, no hash", func() { s.markPaid("") }},
		{3, "cancel", s.cancel},
		{4, "resolve", s.resolve},
		{2, "attach", s.attach},
		{14, "mine", func() {
			sn := s.net()
			k := 1 + s.rnd.IntN(4)
			s.note("mine %d on %s", k, sn.network.Name)
			sn.chain.Mine(k)
		}},
		{5, "reorg", s.reorg},
		{1, "lying node", func() {
			sn := s.net()
			sn.chain.Lying = !sn.chain.Lying
			s.note("%s's node lies: %v", sn.network.Name, sn.chain.Lying)
		}},
		{8, "time passes", s.later},
		{14, "scan", func() { s.sync(s.net()) }},
		{4, "look up claims", func() {
			n, err := s.rec.LookUpHints(s.ctx())
			s.note("look up claims: %d found", n)
			if err != nil {
				s.fail("look-ups: %v", err)
			}
		}},
		{2, "ledger only", func() {
			s.note("post the ledger alone")
			if _, err := s.rec.PostLedger(s.ctx()); err != nil {
				s.fail("post ledger: %v", err)
			}
		}},
		{1, "restart the reconciler", func() { s.note("restart the reconciler"); s.restartReconciler() }},
	}
	total := 0
	for _, a := range actions {
		total += a.weight
	}
	for s.steps = 1; s.steps <= steps; s.steps++ {
		r := s.rnd.IntN(total)
		for _, a := range actions {
			if r < a.weight {
				a.do()
				break
			}
			r -= a.weight
		}
		if s.rnd.IntN(10) < 7 {
			s.pass()
		}
	}
	s.steps--
	// The end: every chain scanned, a pass, and everything settled down.
	for _, sn := range s.nets {
		sn.chain.Mine(4)
		s.sync(sn)
	}
	s.pass()
}

// pass runs a reconciler pass and checks everything.
func (s *sim) pass() {
	s.t.Helper()
	res, err := s.rec.Pass(s.ctx())
	if err != nil {
		s.fail("pass: %v", err)
	}
	if res != (reconcile.Result{}) {
		s.note("pass: %s", res)
	}
	if err := reconcile.CheckInvariants(s.ctx(), s.db); err != nil {
		s.fail("invariants:\n%v", err)
	}
	if err := s.rec.CheckDecisions(s.ctx()); err != nil {
		s.fail("decisions:\n%v", err)
	}
	s.checkClaims()
	if s.rnd.IntN(4) == 0 {
		if res2, err := s.rec.Pass(s.ctx()); err != nil || res2.Transitions != 0 || res2.Matched != 0 || res2.Entries != 0 {
			s.fail("a second pass right after changed something: %v %v", res2, err)
		}
	}
}

// checkClaims: a payment to an order's own address is that order's; a
// claim never takes the exact payment of another order, and a payment
// meant for another order never settles a claimant's order by itself.
func (s *sim) checkClaims() {
	var rows []struct {
		TxHash   string  `db:"tx_hash"`
		Amount   string  `db:"amount"`
		OrderID  string  `db:"order_id"`
		Kind     string  `db:"match_kind"`
		Status   string  `db:"status"`
		Accepted *string `db:"accepted_amount"`
	}
	if err := s.db.Select(&rows, `SELECT t.tx_hash, t.amount::text AS amount, t.order_id, t.match_kind, o.status,
			o.accepted_amount::text AS accepted_amount
		FROM transfers t JOIN orders o ON o.id = t.order_id WHERE t.match_kind IN ('hint', 'address')`); err != nil {
		s.fail("read matches: %v", err)
	}
	for _, r := range rows {
		p, o := s.byTx[r.TxHash], s.byID[r.OrderID]
		if p == nil || o == nil {
			s.fail("matched transfer of unknown tx %s or order %s", r.TxHash, r.OrderID)
		}
		if p.intended == nil || p.intended == o {
			continue
		}
		switch {
		case r.Kind == "address":
			s.fail("a payment meant for order %d was matched by address to order %d", p.intended.n, o.n)
		case r.Amount == p.intended.o.PayAmount.String() && s.couldPay(r.TxHash, p.intended):
			s.fail("order %d's claim took the exact payment of order %d", o.n, p.intended.n)
		case r.Status == string(paywatch.StatusSettled) && r.Accepted == nil:
			s.fail("order %d settled on a payment meant for order %d, by a claim", o.n, p.intended.n)
		}
	}
}

// couldPay reports whether the transfer of a transaction was mined where
// the order could be paid from (after its creation, before its window
// ended): only then is an exact payment that order's by right.
func (s *sim) couldPay(txHash string, o *simOrder) bool {
	var ok bool
	if err := s.db.Get(&ok, `SELECT bool_and(t.block_number > o.created_height
			AND coalesce(t.block_time, t.first_seen_at) <= o.monitor_until)
		FROM transfers t, orders o WHERE t.tx_hash = $1 AND o.id = $2`, txHash, o.o.ID); err != nil {
		s.fail("read eligibility: %v", err)
	}
	return ok
}

// sync scans a network's chain up to its head.
func (s *sim) sync(sn *simNet) {
	s.t.Helper()
	for i := 0; ; i++ {
		caughtUp, err := sn.scanner.Step(s.ctx())
		if err != nil {
			s.fail("scan %s: %v", sn.network.Name, err)
		}
		if caughtUp {
			break
		}
		if i > 1000 {
			s.fail("the scanner of %s never caught up", sn.network.Name)
		}
	}
	s.note("scanned %s to %d", sn.network.Name, sn.chain.Height())
	// Scanned to the head: every live transfer is on the canonical chain,
	// and every output of the canonical chain is recorded once.
	var rows []struct {
		Number uint64 `db:"block_number"`
		Hash   string `db:"block_hash"`
		TxHash string `db:"tx_hash"`
	}
	if err := s.db.Select(&rows, `SELECT block_number, block_hash, tx_hash FROM transfers
		WHERE network = $1 AND state <> 'orphaned'`, sn.network.Name); err != nil {
		s.fail("read transfers: %v", err)
	}
	for _, r := range rows {
		if !sn.chain.Canonical(r.Number, r.Hash) {
			s.fail("transfer of %s is live in block %d %s, which is not canonical", r.TxHash, r.Number, r.Hash)
		}
	}
	canonical := 0
	for _, p := range s.pays {
		if p.sn == sn {
			canonical += len(sn.chain.Mined(p.tx.Hash))
		}
	}
	if len(rows) != canonical {
		s.fail("%s: %d live transfers recorded, %d outputs on the canonical chain", sn.network.Name, len(rows), canonical)
	}
}

func (s *sim) create() {
	sn := s.net()
	amounts := []int64{5_000_000, 5_000_001, 5_000_002, 7_500_000, 10_000_000}
	if sn.asset.Mode == paywatch.ModePerOrder {
		amounts = []int64{100_000, 250_000, 1_000_000}
	}
	s.createFor(sn, pick(s, amounts))
}

func (s *sim) createFor(sn *simNet, amount int64) *simOrder {
	n := len(s.orders) + 1
	expiry := pick(s, []time.Duration{20 * time.Minute, time.Hour, 3 * time.Hour})
	o, _, err := s.store.Create(s.ctx(), orders.CreateRequest{ExternalID: fmt.Sprintf("sim-%d", n), Network: sn.network,
		Asset: sn.asset, Amount: big.NewInt(amount), ExpiresIn: expiry, Actor: "shop"})
	if paywatch.ErrorCode(err) == paywatch.CodeNoUniqueAmount {
		s.note("create on %s for %d: no unique amount left", sn.network.Name, amount)
		return nil
	}
	if err != nil {
		s.fail("create: %v", err)
	}
	so := &simOrder{n: n, o: o, sn: sn}
	s.orders = append(s.orders, so)
	s.byID[o.ID] = so
	s.note("order %d on %s pays %s to %s, expires in %s", n, sn.network.Name, o.PayAmount, short(o.PayAddress), expiry)
	return so
}

func short(s string) string { return s[:min(len(s), 12)] }

// recent returns an order among the last ones created, or nil.
func (s *sim) recent() *simOrder {
	if len(s.orders) == 0 {
		return nil
	}
	k := min(len(s.orders), 12)
	return s.orders[len(s.orders)-1-s.rnd.IntN(k)]
}

func (s *sim) send(sn *simNet, intended *simOrder, outputs ...reconciletest.Output) *simPay {
	tx := sn.chain.Send(sn.asset, outputs...)
	p := &simPay{tx: tx, sn: sn, intended: intended}
	s.pays = append(s.pays, p)
	s.byTx[tx.Hash] = p
	return p
}

// payFor pays a recent order: exactly (off 0) or off by a few base units
// either way (an exchange's fee, a customer's rounding).
func (s *sim) payFor(off int) {
	o := s.recent()
	if o == nil {
		return
	}
	amount := new(big.Int).Set(o.o.PayAmount)
	if off > 0 {
		delta := big.NewInt(int64(off) * pick(s, []int64{1, 3, 1000}))
		if s.rnd.IntN(2) == 0 && amount.Cmp(delta) > 0 {
			delta.Neg(delta)
		}
		amount.Add(amount, delta)
	}
	p := s.send(o.sn, o, reconciletest.Output{To: o.o.PayAddress, Amount: amount})
	s.note("pay order %d %s (tx %s)", o.n, amount, short(p.tx.Hash))
}

// paySplit pays an order in two parts, in one transaction or two.
func (s *sim) paySplit() {
	o := s.recent()
	if o == nil {
		return
	}
	first := new(big.Int).Div(o.o.PayAmount, big.NewInt(int64(2+s.rnd.IntN(3))))
	rest := new(big.Int).Sub(o.o.PayAmount, first)
	if s.rnd.IntN(4) == 0 {
		rest.Add(rest, big.NewInt(1)) // a part too much
	}
	if s.rnd.IntN(2) == 0 {
		p := s.send(o.sn, o, reconciletest.Output{To: o.o.PayAddress, Amount: first}, reconciletest.Output{To: o.o.PayAddress, Amount: rest})
		s.note("pay order %d %s + %s in one tx %s", o.n, first, rest, short(p.tx.Hash))
		return
	}
	a := s.send(o.sn, o, reconciletest.Output{To: o.o.PayAddress, Amount: first})
	b := s.send(o.sn, o, reconciletest.Output{To: o.o.PayAddress, Amount: rest})
	s.note("pay order %d %s (tx %s) + %s (tx %s)", o.n, first, short(a.tx.Hash), rest, short(b.tx.Hash))
}

// payStray sends the shop an amount no order asked for: a victim's short
// payment, a dust attack, a mistake.
func (s *sim) payStray() {
	sn := s.nets[0]
	amount := big.NewInt(pick(s, []int64{50, 4_999_000, 5_000_003, 6_000_000, 7_500_000}))
	p := s.send(sn, nil, reconciletest.Output{To: reconciletest.Shop, Amount: amount})
	s.note("stray payment of %s to the shop (tx %s)", amount, short(p.tx.Hash))
}

// claimStray is the attack of an order created for exactly the amount of a
// payment already on chain.
func (s *sim) claimStray() {
	var strays []*simPay
	for _, p := range s.pays {
		if p.intended == nil {
			strays = append(strays, p)
		}
	}
	if len(strays) == 0 {
		return
	}
	p := pick(s, strays)
	o := s.createFor(p.sn, p.tx.Outputs[0].Amount.Int64())
	if o != nil {
		s.note("  (order %d is an attacker's, for the stray %s)", o.n, short(p.tx.Hash))
		if s.rnd.IntN(2) == 0 {
			s.claim(o, p.tx.Hash, "the stray's")
		}
	}
}

func (s *sim) markPaid(kind string) {
	o := s.recent()
	if o == nil {
		return
	}
	hash := ""
	switch kind {
	case "honest":
		var own []*simPay
		for _, p := range s.pays {
			if p.intended == o {
				own = append(own, p)
			}
		}
		if len(own) > 0 {
			hash = pick(s, own).tx.Hash
		}
	case "hostile":
		var others []*simPay
		for _, p := range s.pays {
			if p.intended != o && p.sn == o.sn {
				others = append(others, p)
			}
		}
		if len(others) > 0 {
			hash = pick(s, others).tx.Hash
		}
	case "random":
		hash = fmt.Sprintf("0x7%016x%016x", s.rnd.Uint64(), s.rnd.Uint64())
	}
	s.claim(o, hash, kind)
}

func (s *sim) claim(o *simOrder, hash, kind string) {
	_, err := s.store.MarkPaid(s.ctx(), o.o.ID, hash, "shop")
	s.note("order %d marked paid, %s claim %s: %v", o.n, kind, short(hash), err)
	if err != nil && paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
		s.fail("mark paid: %v", err)
	}
}

func (s *sim) cancel() {
	o := s.recent()
	if o == nil {
		return
	}
	_, err := s.store.Cancel(s.ctx(), o.o.ID, "shop")
	s.note("cancel order %d: %v", o.n, err)
	if err != nil && paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
		s.fail("cancel: %v", err)
	}
}

// inState returns the driver's orders in a status, in creation order.
func (s *sim) inState(status paywatch.Status) []*simOrder {
	var ids []string
	if err := s.db.Select(&ids, `SELECT id FROM orders WHERE status = $1`, string(status)); err != nil {
		s.fail("read orders: %v", err)
	}
	var out []*simOrder
	for _, id := range ids {
		out = append(out, s.byID[id])
	}
	slices.SortFunc(out, func(a, b *simOrder) int { return a.n - b.n })
	return out
}

func (s *sim) resolve() {
	disputed := s.inState(paywatch.StatusDisputed)
	if len(disputed) == 0 {
		return
	}
	o := pick(s, disputed)
	outcome := pick(s, reconcile.Outcomes)
	err := s.op.Resolve(s.ctx(), o.o.ID, outcome, "the simulation decides", "operator")
	s.note("resolve order %d as %s: %v", o.n, outcome, err)
	if err != nil && paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
		s.fail("resolve: %v", err)
	}
}

func (s *sim) attach() {
	var inbox []struct {
		ID      string `db:"id"`
		Network string `db:"network"`
		TxHash  string `db:"tx_hash"`
	}
	if err := s.db.Select(&inbox, `SELECT id, network, tx_hash FROM transfers WHERE order_id IS NULL AND state <> 'orphaned'
		ORDER BY tx_hash, tx_key`); err != nil {
		s.fail("read the inbox: %v", err)
	}
	if len(inbox) == 0 {
		return
	}
	t := pick(s, inbox)
	var candidates []*simOrder
	for _, o := range s.orders {
		if o.sn.network.Name == t.Network {
			candidates = append(candidates, o)
		}
	}
	if len(candidates) == 0 {
		return
	}
	o := pick(s, candidates)
	err := s.op.Attach(s.ctx(), t.ID, o.o.ID, "the simulation attaches", "operator")
	s.note("attach tx %s to order %d: %v", short(t.TxHash), o.n, err)
	if err != nil && paywatch.ErrorCode(err) != paywatch.CodeInvalidState {
		s.fail("attach: %v", err)
	}
}

func (s *sim) reorg() {
	sn := s.net()
	depth := 1 + s.rnd.IntN(4)
	if s.rnd.IntN(4) == 0 {
		depth += 4 // deeper than the confirmations
	}
	extra := s.rnd.IntN(3)
	dropped := sn.chain.Reorg(depth, extra, 0.5, 0.25)
	s.note("reorg %s: %d blocks replaced by %d, %d transactions dropped", sn.network.Name, depth, depth+extra, dropped)
}

func (s *sim) later() {
	d := pick(s, []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute, time.Hour, 3 * time.Hour, 7 * time.Hour})
	s.clock.Advance(d)
	s.note("time passes: %s", d)
}
