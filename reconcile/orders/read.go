package orders

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
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

func bigInt(s string) *big.Int {
	v, ok := new(big.Int).SetString(s, 10)
	if !ok {
		return new(big.Int)
	}
	return v
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func (r *orderRow) order() *paywatch.Order {
	o := &paywatch.Order{
		ID: r.ID, ExternalID: r.ExternalID, Network: r.Network, Asset: r.Asset, AssetContract: r.AssetContract,
		Amount: bigInt(r.Amount), PayAmount: bigInt(r.PayAmount), PayAddress: r.PayAddress,
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
	return o
}

// Get returns one order with its matched transfers.
func (s *Store) Get(ctx context.Context, id string) (*paywatch.Order, error) {
	var rows []orderRow
	if err := s.db.SelectContext(ctx, &rows, `SELECT `+orderColumns+` FROM orders WHERE id = $1`, id); err != nil {
		return nil, fmt.Errorf("read order %s: %w", id, err)
	}
	if len(rows) == 0 {
		return nil, paywatch.Errorf(paywatch.CodeNotFound, "no order %q", id)
	}
	orders := []*paywatch.Order{rows[0].order()}
	if err := s.attachTransfers(ctx, orders); err != nil {
		return nil, err
	}
	return orders[0], nil
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
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.ExternalID != "" {
		add("external_id = $%d", f.ExternalID)
	}
	if f.Status != "" {
		add("status = $%d", string(f.Status))
	}
	if f.Network != "" {
		add("network = $%d", f.Network)
	}
	if f.Cursor != "" {
		at, id, err := DecodeCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		args = append(args, at, id)
		where = append(where, fmt.Sprintf("(created_at, id) < ($%d, $%d)", len(args)-1, len(args)))
	}
	q := `SELECT ` + orderColumns + ` FROM orders`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, f.Limit+1)
	q += fmt.Sprintf(" ORDER BY created_at DESC, id DESC LIMIT $%d", len(args))
	var rows []orderRow
	if err := s.db.SelectContext(ctx, &rows, q, args...); err != nil {
		return nil, "", fmt.Errorf("list orders: %w", err)
	}
	next := ""
	if len(rows) > f.Limit {
		rows = rows[:f.Limit]
		last := rows[len(rows)-1]
		next = EncodeCursor(last.CreatedAt, last.ID)
	}
	orders := make([]*paywatch.Order, len(rows))
	for i := range rows {
		orders[i] = rows[i].order()
	}
	if err := s.attachTransfers(ctx, orders); err != nil {
		return nil, "", err
	}
	return orders, next, nil
}

// EncodeCursor makes an opaque page cursor from the last item's sort key.
func EncodeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixMicro(), 10) + "|" + id))
}

// DecodeCursor reads a cursor made by EncodeCursor.
func DecodeCursor(c string) (time.Time, string, error) {
	bad := paywatch.Errorf(paywatch.CodeInvalidRequest, "cursor %q is not one this server gave out", c)
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", bad
	}
	micros, id, ok := strings.Cut(string(raw), "|")
	n, err := strconv.ParseInt(micros, 10, 64)
	if !ok || err != nil || id == "" {
		return time.Time{}, "", bad
	}
	return time.UnixMicro(n).UTC(), id, nil
}

type transferRow struct {
	ID            string         `db:"id"`
	OrderID       *string        `db:"order_id"`
	Network       string         `db:"network"`
	Asset         string         `db:"asset"`
	AssetContract string         `db:"asset_contract"`
	TxHash        string         `db:"tx_hash"`
	Index         int64          `db:"idx"`
	From          string         `db:"from_address"`
	To            string         `db:"to_address"`
	Amount        string         `db:"amount"`
	BlockNumber   uint64         `db:"block_number"`
	BlockHash     string         `db:"block_hash"`
	State         string         `db:"state"`
	Flags         pq.StringArray `db:"flags"`
	FirstSeenAt   time.Time      `db:"first_seen_at"`
	Confirmations uint64         `db:"confirmations"`
}

// TransferColumns selects a transfer with its confirmations, computed from
// its network's head; the query must join chain_cursors as c.
const TransferColumns = `t.id, t.order_id, t.network, t.asset, t.asset_contract, t.tx_hash, t.idx,
	t.from_address, t.to_address, t.amount::text AS amount, t.block_number, t.block_hash, t.state,
	t.flags, t.first_seen_at,
	CASE WHEN t.state = 'orphaned' OR c.head IS NULL OR c.head < t.block_number THEN 0
	     ELSE c.head - t.block_number + 1 END AS confirmations`

func (r *transferRow) transfer() paywatch.Transfer {
	t := paywatch.Transfer{
		ID: r.ID, Network: r.Network, Asset: r.Asset, AssetContract: r.AssetContract, TxHash: r.TxHash,
		Index: r.Index, From: r.From, To: r.To, Amount: bigInt(r.Amount), BlockNumber: r.BlockNumber,
		BlockHash: r.BlockHash, Confirmations: r.Confirmations, State: paywatch.TransferState(r.State),
		Flags: []string(r.Flags), FirstSeenAt: r.FirstSeenAt.UTC(),
	}
	if r.OrderID != nil {
		t.OrderID = *r.OrderID
	}
	if t.Flags == nil {
		t.Flags = []string{}
	}
	return t
}

// attachTransfers loads the matched transfers of a page of orders in one
// query and sums what each order received.
func (s *Store) attachTransfers(ctx context.Context, orders []*paywatch.Order) error {
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
	if err := s.db.SelectContext(ctx, &rows, `SELECT `+TransferColumns+`
		FROM transfers t LEFT JOIN chain_cursors c ON c.network = t.network
		WHERE t.order_id = ANY($1) ORDER BY t.block_number, t.idx`, pq.Array(ids)); err != nil {
		return fmt.Errorf("read transfers of orders: %w", err)
	}
	for i := range rows {
		t := rows[i].transfer()
		o := byID[t.OrderID]
		o.Transfers = append(o.Transfers, t)
		if t.State != paywatch.TransferOrphaned {
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
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.Matched != nil {
		if *f.Matched {
			where = append(where, "t.order_id IS NOT NULL")
		} else {
			where = append(where, "t.order_id IS NULL")
		}
	}
	if f.State != "" {
		add("t.state = $%d", string(f.State))
	}
	if f.Network != "" {
		add("t.network = $%d", f.Network)
	}
	if f.Asset != "" {
		add("t.asset = $%d", f.Asset)
	}
	if f.Cursor != "" {
		at, id, err := DecodeCursor(f.Cursor)
		if err != nil {
			return nil, "", err
		}
		args = append(args, at, id)
		where = append(where, fmt.Sprintf("(t.first_seen_at, t.id) < ($%d, $%d)", len(args)-1, len(args)))
	}
	q := `SELECT ` + TransferColumns + ` FROM transfers t LEFT JOIN chain_cursors c ON c.network = t.network`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, f.Limit+1)
	q += fmt.Sprintf(" ORDER BY t.first_seen_at DESC, t.id DESC LIMIT $%d", len(args))
	var rows []transferRow
	if err := s.db.SelectContext(ctx, &rows, q, args...); err != nil {
		return nil, "", fmt.Errorf("list transfers: %w", err)
	}
	next := ""
	if len(rows) > f.Limit {
		rows = rows[:f.Limit]
		last := rows[len(rows)-1]
		next = EncodeCursor(last.FirstSeenAt, last.ID)
	}
	out := make([]paywatch.Transfer, len(rows))
	for i := range rows {
		out[i] = rows[i].transfer()
	}
	return out, next, nil
}

// GetTransfer returns one transfer.
func (s *Store) GetTransfer(ctx context.Context, id string) (*paywatch.Transfer, error) {
	var rows []transferRow
	if err := s.db.SelectContext(ctx, &rows, `SELECT `+TransferColumns+`
		FROM transfers t LEFT JOIN chain_cursors c ON c.network = t.network WHERE t.id = $1`, id); err != nil {
		return nil, fmt.Errorf("read transfer %s: %w", id, err)
	}
	if len(rows) == 0 {
		return nil, paywatch.Errorf(paywatch.CodeNotFound, "no transfer %q", id)
	}
	t := rows[0].transfer()
	return &t, nil
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }
