package orders

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"golang.org/x/sync/errgroup"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
)

type orderRow struct {
	ID                   string     `db:"id"`
	ExternalID           string     `db:"external_id"`
	Network              string     `db:"network"`
	Asset                string     `db:"asset"`
	AssetContract        string     `db:"asset_contract"`
	Amount               string     `db:"amount"`
	PayAmount            string     `db:"pay_amount"`
	PayAddress           string     `db:"pay_address"`
	Status               string     `db:"status"`
	DisputeReason        *string    `db:"dispute_reason"`
	CustomerMarkedPaidAt *time.Time `db:"customer_marked_paid_at"`
	TxHashHint           *string    `db:"tx_hash_hint"`
	Metadata             *string    `db:"metadata"`
	CreatedAt            time.Time  `db:"created_at"`
	ExpiresAt            time.Time  `db:"expires_at"`
	MonitorUntil         time.Time  `db:"monitor_until"`
	SettledAt            *time.Time `db:"settled_at"`
}

const orderColumns = `id, external_id, network, asset, asset_contract, amount::text AS amount,
	pay_amount::text AS pay_amount, pay_address, status, dispute_reason, customer_marked_paid_at,
	tx_hash_hint, metadata::text AS metadata, created_at, expires_at, monitor_until, settled_at`

// units reads a NUMERIC amount PostgreSQL gave as text. A value that does
// not parse is an error, never a silent zero.
func units(s, what string) (*big.Int, error) {
	v, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return nil, fmt.Errorf("%s %q from the database is not an integer", what, s)
	}
	return v, nil
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func (r *orderRow) order() (*paywatch.Order, error) {
	amount, err := units(r.Amount, "amount of order "+r.ID)
	if err != nil {
		return nil, err
	}
	pay, err := units(r.PayAmount, "pay amount of order "+r.ID)
	if err != nil {
		return nil, err
	}
	o := &paywatch.Order{
		ID: r.ID, ExternalID: r.ExternalID, Network: r.Network, Asset: r.Asset, AssetContract: r.AssetContract,
		Amount: amount, PayAmount: pay, PayAddress: r.PayAddress,
		Status: paywatch.Status(r.Status), CustomerMarkedPaidAt: utcPtr(r.CustomerMarkedPaidAt),
		CreatedAt: r.CreatedAt.UTC(), ExpiresAt: r.ExpiresAt.UTC(), MonitorUntil: r.MonitorUntil.UTC(),
		SettledAt: utcPtr(r.SettledAt), ReceivedAmount: new(big.Int), Transfers: []paywatch.Transfer{},
	}
	if r.DisputeReason != nil {
		o.DisputeReason = paywatch.Reason(*r.DisputeReason)
	}
	if r.TxHashHint != nil {
		o.TxHashHint = *r.TxHashHint
	}
	if r.Metadata != nil {
		o.Metadata = json.RawMessage(*r.Metadata)
	}
	return o, nil
}

// Get returns one order with its matched transfers, through statements
// prepared once per connection (planning them again each time would cost
// more than running them). An order with no transfer (awaiting payment, as
// a checkout polls it) is read by a statement about half the cost of the
// one that also gathers transfers; an order with any is read again whole,
// by that one, in one snapshot. A read whose pooled connection turned out
// dead is made again on another (pg.Read).
func (s *Store) Get(ctx context.Context, id string) (*paywatch.Order, error) {
	if !pg.ValidText(id) {
		return nil, paywatch.Errorf(paywatch.CodeNotFound, "no order %.80q", id)
	}
	var o *paywatch.Order
	err := pg.Read(ctx, s.db, func() (err error) {
		o, err = s.get(ctx, id)
		return err
	})
	return o, err
}

// get reads one order, once (Get).
func (s *Store) get(ctx context.Context, id string) (*paywatch.Order, error) {
	bare, full, err := s.getStatements(ctx)
	if err != nil {
		return getOrder(ctx, s.db, id)
	}
	var head orderHead
	switch err := head.scan(bare.QueryRowContext(ctx, id)); {
	case errors.Is(err, sql.ErrNoRows):
		return nil, paywatch.Errorf(paywatch.CodeNotFound, "no order %q", id)
	case err != nil:
		return nil, fmt.Errorf("read order %s: %w", id, err)
	case !head.HasTransfers:
		return orderFrom([]orderWithTransfers{{orderRow: head.orderRow, Transfers: "[]"}}, id)
	}
	var rows []orderWithTransfers
	if err := full.SelectContext(ctx, &rows, id); err != nil {
		return nil, fmt.Errorf("read order %s: %w", id, err)
	}
	return orderFrom(rows, id)
}

// Warm opens n of the pool's connections at once, reads an order on each
// (an id no order has), and leaves them idle in the pool. The first burst
// of reads after a start then finds them open, instead of queueing while
// the pool opens them (each a TCP and authentication round trip and a
// server process), and each session's first read of the orders (where
// the server loads what it knows of the table and its indexes) is behind
// it. The pool must keep n idle connections (migrations.Open keeps all).
// A failure leaves the pool as it is, opening connections when needed.
func (s *Store) Warm(ctx context.Context, n int) error {
	conns := make([]*sql.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close() // back to the pool, once all are open
			}
		}
	}()
	g, ctx := errgroup.WithContext(ctx)
	for i := range conns {
		g.Go(func() error {
			c, err := s.db.Conn(ctx)
			if err != nil {
				return err
			}
			conns[i] = c
			rows, err := c.QueryContext(ctx, getOrderHeadSQL, "")
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("open %d connections to read orders: %w", n, err)
	}
	return nil
}

// getStatements prepares getOrderHeadSQL and getOrderSQL once.
func (s *Store) getStatements(ctx context.Context) (bare, full *sqlx.Stmt, err error) {
	if full, err = s.statement(ctx, getOrderSQL); err != nil {
		return nil, nil, err
	}
	if bare, err = s.statement(ctx, getOrderHeadSQL); err != nil {
		return nil, nil, err
	}
	return bare, full, nil
}

// orderHead is an order's row and whether it has any transfer to list
// (getOrderHeadSQL).
type orderHead struct {
	orderRow
	HasTransfers bool
}

// scan reads getOrderHeadSQL's row: the columns of orderColumns, in their
// order, then has_transfers. (A checkout page polls this read; scanning
// by position spares it sqlx's mapping by name.)
func (h *orderHead) scan(row *sql.Row) error {
	o := &h.orderRow
	return row.Scan(&o.ID, &o.ExternalID, &o.Network, &o.Asset, &o.AssetContract, &o.Amount, &o.PayAmount,
		&o.PayAddress, &o.Status, &o.DisputeReason, &o.CustomerMarkedPaidAt, &o.TxHashHint, &o.Metadata,
		&o.CreatedAt, &o.ExpiresAt, &o.MonitorUntil, &o.SettledAt, &h.HasTransfers)
}

// getOrderHeadSQL reads one order ($1) and whether transfersOf may list
// anything for it: whether a transfer or a mempool sighting was ever tied
// to it (orders.has_transfers, which triggers set in the statement that
// ties one). It may say so when transfersOf lists nothing (a payment
// detached, a sighting already mined), never the other way round.
var getOrderHeadSQL = `SELECT ` + orderColumns + `, o.has_transfers FROM orders o WHERE o.id = $1`

type orderWithTransfers struct {
	orderRow
	Transfers string `db:"transfers_json"`
}

// getOrderSQL reads one order ($1) with its transfers, in one statement: a
// read of an order is one round trip.
var getOrderSQL = `SELECT ` + orderColumns + `,
	(SELECT coalesce(json_agg(x ORDER BY x.state = 'mempool', x.block_number, x.first_seen_at, x.idx), '[]')::text
	 FROM (` + transfersOf("o.id") + `) x) AS transfers_json
	FROM orders o WHERE o.id = $1`

// getOrder reads one order with its transfers through q (the database or
// a transaction).
func getOrder(ctx context.Context, q sqlx.QueryerContext, id string) (*paywatch.Order, error) {
	if !pg.ValidText(id) {
		return nil, paywatch.Errorf(paywatch.CodeNotFound, "no order %.80q", id)
	}
	var rows []orderWithTransfers
	if err := sqlx.SelectContext(ctx, q, &rows, getOrderSQL, id); err != nil {
		return nil, fmt.Errorf("read order %s: %w", id, err)
	}
	return orderFrom(rows, id)
}

func orderFrom(rows []orderWithTransfers, id string) (*paywatch.Order, error) {
	if len(rows) == 0 {
		return nil, paywatch.Errorf(paywatch.CodeNotFound, "no order %q", id)
	}
	o, err := rows[0].order()
	if err != nil {
		return nil, err
	}
	var trs []transferRow
	if err := json.Unmarshal([]byte(rows[0].Transfers), &trs); err != nil {
		return nil, fmt.Errorf("read transfers of %s: %w", id, err)
	}
	for i := range trs {
		t, err := trs[i].transfer()
		if err != nil {
			return nil, err
		}
		o.Transfers = append(o.Transfers, t)
		if t.State != paywatch.TransferOrphaned && t.State != paywatch.TransferMempool {
			o.ReceivedAmount.Add(o.ReceivedAmount, t.Amount)
		}
	}
	return o, nil
}

// Filter selects orders for List.
type Filter struct {
	ExternalID string
	Status     paywatch.Status
	Network    string
	Limit      int
	Cursor     string
}

// List returns orders newest first, and the cursor of the next page ("" at
// the end).
func (s *Store) List(ctx context.Context, f Filter) ([]*paywatch.Order, string, error) {
	var orders []*paywatch.Order
	var next string
	err := pg.Read(ctx, s.db, func() (err error) {
		orders, next, err = s.list(ctx, f)
		return err
	})
	return orders, next, err
}

// list reads one page of orders, once (List).
func (s *Store) list(ctx context.Context, f Filter) ([]*paywatch.Order, string, error) {
	p := pg.Page{From: `SELECT ` + orderColumns + ` FROM orders`, TimeCol: "created_at", IDCol: "id",
		Limit: f.Limit, Cursor: f.Cursor}
	if f.ExternalID != "" {
		p.Where("external_id = ?", f.ExternalID)
	}
	if f.Status != "" {
		p.Where("status = ?", string(f.Status))
	}
	if f.Network != "" {
		p.Where("network = ?", f.Network)
	}
	q, args, err := p.SQL()
	if err != nil {
		return nil, "", err
	}
	var rows []orderRow
	if err := s.db.SelectContext(ctx, &rows, q, args...); err != nil {
		return nil, "", fmt.Errorf("list orders: %w", err)
	}
	rows, next := pg.Next(rows, f.Limit, func(r *orderRow) (time.Time, string) { return r.CreatedAt, r.ID })
	orders := make([]*paywatch.Order, len(rows))
	for i := range rows {
		if orders[i], err = rows[i].order(); err != nil {
			return nil, "", err
		}
	}
	if err := attachTransfers(ctx, s.db, orders); err != nil {
		return nil, "", err
	}
	return orders, next, nil
}

type transferRow struct {
	ID            string         `db:"id" json:"id"`
	OrderID       *string        `db:"order_id" json:"order_id"`
	Network       string         `db:"network" json:"network"`
	Asset         string         `db:"asset" json:"asset"`
	AssetContract string         `db:"asset_contract" json:"asset_contract"`
	TxHash        string         `db:"tx_hash" json:"tx_hash"`
	Index         int64          `db:"idx" json:"idx"`
	From          string         `db:"from_address" json:"from_address"`
	To            string         `db:"to_address" json:"to_address"`
	Amount        string         `db:"amount" json:"amount"`
	BlockNumber   uint64         `db:"block_number" json:"block_number"`
	BlockHash     string         `db:"block_hash" json:"block_hash"`
	State         string         `db:"state" json:"state"`
	Flags         pq.StringArray `db:"flags" json:"flags"`
	FirstSeenAt   time.Time      `db:"first_seen_at" json:"first_seen_at"`
	Confirmations uint64         `db:"confirmations" json:"confirmations"`
}

// TransferColumns selects a transfer with its confirmations, computed from
// its network's head; the query must join chain_cursors as c.
const TransferColumns = `t.id, t.order_id, t.network, t.asset, t.asset_contract, t.tx_hash, t.idx,
	t.from_address, t.to_address, t.amount::text AS amount, t.block_number, t.block_hash, t.state,
	t.flags, t.first_seen_at,
	CASE WHEN t.state = 'orphaned' OR c.head IS NULL OR c.head < t.block_number THEN 0
	     ELSE c.head - t.block_number + 1 END AS confirmations`

// mempoolColumns selects a payment seen in a mempool (mempool_transfers
// as m) like a transfer: state mempool, no block, 0 confirmations.
const mempoolColumns = `m.id, m.order_id, m.network, m.asset, '' AS asset_contract, m.tx_hash, m.idx,
	'' AS from_address, m.to_address, m.amount::text AS amount, 0::bigint AS block_number, '' AS block_hash,
	'` + string(paywatch.TransferMempool) + `' AS state, m.flags, m.first_seen_at, 0::bigint AS confirmations`

func (r *transferRow) transfer() (paywatch.Transfer, error) {
	amount, err := units(r.Amount, "amount of transfer "+r.ID)
	if err != nil {
		return paywatch.Transfer{}, err
	}
	t := paywatch.Transfer{
		ID: r.ID, Network: r.Network, Asset: r.Asset, AssetContract: r.AssetContract, TxHash: r.TxHash,
		Index: r.Index, From: r.From, To: r.To, Amount: amount, BlockNumber: r.BlockNumber,
		BlockHash: r.BlockHash, Confirmations: r.Confirmations, State: paywatch.TransferState(r.State),
		Flags: []string(r.Flags), FirstSeenAt: r.FirstSeenAt.UTC(),
	}
	if r.OrderID != nil {
		t.OrderID = *r.OrderID
	}
	if t.Flags == nil {
		t.Flags = []string{}
	}
	return t, nil
}

// transfersOf selects the transfers matched to the orders whose id is
// orderID (an SQL expression: "o.id", "ANY($1)"), and the mempool
// sightings of theirs that no transfer in a block has replaced yet.
func transfersOf(orderID string) string {
	return `SELECT ` + TransferColumns + `
		FROM transfers t LEFT JOIN chain_cursors c ON c.network = t.network
		WHERE t.order_id = ` + orderID + `
		UNION ALL
		SELECT ` + mempoolColumns + `
		FROM mempool_transfers m
		WHERE m.order_id = ` + orderID + ` AND m.left_at IS NULL AND NOT EXISTS (SELECT 1 FROM transfers t
			WHERE t.network = m.network AND t.tx_hash = m.tx_hash AND t.tx_key = m.tx_key AND t.state <> 'orphaned')`
}

// attachTransfers loads the matched transfers of a page of orders in one
// query and sums what each order received.
func attachTransfers(ctx context.Context, q sqlx.QueryerContext, orders []*paywatch.Order) error {
	if len(orders) == 0 {
		return nil
	}
	byID := make(map[string]*paywatch.Order, len(orders))
	ids := make([]string, len(orders))
	for i, o := range orders {
		byID[o.ID] = o
		ids[i] = o.ID
	}
	var rows []transferRow
	if err := sqlx.SelectContext(ctx, q, &rows, `SELECT * FROM (`+transfersOf("ANY($1)")+`) x
		ORDER BY state = 'mempool', block_number, first_seen_at, idx`, pq.Array(ids)); err != nil {
		return fmt.Errorf("read transfers of orders: %w", err)
	}
	for i := range rows {
		t, err := rows[i].transfer()
		if err != nil {
			return err
		}
		o := byID[t.OrderID]
		o.Transfers = append(o.Transfers, t)
		if t.State != paywatch.TransferOrphaned && t.State != paywatch.TransferMempool {
			o.ReceivedAmount.Add(o.ReceivedAmount, t.Amount)
		}
	}
	return nil
}

// TransferFilter selects transfers for ListTransfers.
type TransferFilter struct {
	Matched *bool
	State   paywatch.TransferState
	Network string
	Asset   string
	Limit   int
	Cursor  string
}

// ListTransfers returns transfers newest first, and the next page's cursor.
func (s *Store) ListTransfers(ctx context.Context, f TransferFilter) ([]paywatch.Transfer, string, error) {
	p := pg.Page{From: `SELECT ` + TransferColumns + ` FROM transfers t LEFT JOIN chain_cursors c ON c.network = t.network`,
		TimeCol: "t.first_seen_at", IDCol: "t.id", Limit: f.Limit, Cursor: f.Cursor}
	if f.Matched != nil {
		if *f.Matched {
			p.Where("t.order_id IS NOT NULL")
		} else {
			p.Where("t.order_id IS NULL")
		}
	}
	if f.State != "" {
		p.Where("t.state = ?", string(f.State))
	}
	if f.Network != "" {
		p.Where("t.network = ?", f.Network)
	}
	if f.Asset != "" {
		p.Where("t.asset = ?", f.Asset)
	}
	q, args, err := p.SQL()
	if err != nil {
		return nil, "", err
	}
	var rows []transferRow
	if err := pg.Read(ctx, s.db, func() error {
		rows = nil
		return s.db.SelectContext(ctx, &rows, q, args...)
	}); err != nil {
		return nil, "", fmt.Errorf("list transfers: %w", err)
	}
	rows, next := pg.Next(rows, f.Limit, func(r *transferRow) (time.Time, string) { return r.FirstSeenAt, r.ID })
	out := make([]paywatch.Transfer, len(rows))
	for i := range rows {
		if out[i], err = rows[i].transfer(); err != nil {
			return nil, "", err
		}
	}
	return out, next, nil
}

// GetTransfer returns one transfer.
func (s *Store) GetTransfer(ctx context.Context, id string) (*paywatch.Transfer, error) {
	if !pg.ValidText(id) {
		return nil, paywatch.Errorf(paywatch.CodeNotFound, "no transfer %.80q", id)
	}
	var rows []transferRow
	if err := pg.Read(ctx, s.db, func() error {
		rows = nil
		return s.db.SelectContext(ctx, &rows, `SELECT `+TransferColumns+`
			FROM transfers t LEFT JOIN chain_cursors c ON c.network = t.network WHERE t.id = $1`, id)
	}); err != nil {
		return nil, fmt.Errorf("read transfer %s: %w", id, err)
	}
	if len(rows) == 0 {
		return nil, paywatch.Errorf(paywatch.CodeNotFound, "no transfer %q", id)
	}
	t, err := rows[0].transfer()
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }

// Given returns up to limit addresses handed out below an extended public
// key from index from on, in index order, and the next index to be handed
// out (what a Bitcoin watcher watches: bitcoin.Given). Both come from one
// snapshot.
func (s *Store) Given(ctx context.Context, xpub string, from uint32, limit int) ([]string, uint32, error) {
	var row struct {
		Next  int64          `db:"next"`
		Addrs pq.StringArray `db:"addrs"`
	}
	err := s.db.GetContext(ctx, &row, `SELECT
		coalesce((SELECT next_index FROM derivation_counters WHERE derivation_key = $1), 0) AS next,
		array(SELECT pay_address FROM orders WHERE derivation_key = $1 AND derivation_index >= $2
			ORDER BY derivation_index LIMIT $3) AS addrs`, xpub, int64(from), limit)
	if err != nil {
		return nil, 0, fmt.Errorf("read the addresses handed out: %w", err)
	}
	return row.Addrs, uint32(row.Next), nil
}

// Gap is the run of addresses handed out below an extended public key
// since the last one paid: a wallet restored from the key finds payments
// only up to its gap limit past the last paid address.
type Gap struct {
	// Given is how many addresses were handed out (the next index).
	Given int64
	// LastPaid is the index of the last address that received anything
	// (a live transfer), or -1.
	LastPaid int64
	// Unpaid is the run of unpaid addresses after it; AtLeast when the run
	// is longer than Gap walks back (MaxGapWalk), LastPaid unknown.
	Unpaid  int64
	AtLeast bool
}

// Gap reads the run of unpaid addresses below xpub on a network. It walks
// back from the last address handed out to the last one paid.
func (s *Store) Gap(ctx context.Context, network, xpub string) (Gap, error) {
	var g Gap
	err := s.db.GetContext(ctx, &g.Given, `SELECT coalesce((SELECT next_index FROM derivation_counters WHERE derivation_key = $1), 0)`, xpub)
	if err != nil {
		return g, fmt.Errorf("read the addresses handed out: %w", err)
	}
	err = s.db.GetContext(ctx, &g.LastPaid, `SELECT coalesce((SELECT o.derivation_index FROM orders o
		WHERE o.derivation_key = $2 AND o.derivation_index >= $3 AND EXISTS (SELECT 1 FROM transfers t
			WHERE t.network = $1 AND t.to_address = o.pay_address AND t.state <> 'orphaned')
		ORDER BY o.derivation_index DESC LIMIT 1), -1)`, network, xpub, g.Given-MaxGapWalk)
	if err != nil {
		return g, fmt.Errorf("read the last address paid: %w", err)
	}
	g.Unpaid = max(g.Given-1-g.LastPaid, 0)
	if g.LastPaid < 0 && g.Given > MaxGapWalk {
		g.Unpaid, g.AtLeast = MaxGapWalk, true
	}
	return g, nil
}

// MaxGapWalk bounds the walk back of Gap: a run of unpaid addresses longer
// than this is reported as at least this long.
const MaxGapWalk = 100_000
