package orders

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
)

// CreateRequest is a validated request to open an order dossier.
type CreateRequest struct {
	ExternalID string
	Network    *paywatch.Network
	Asset      *paywatch.Asset
	Amount     *big.Int // base units, validated against the asset
	ExpiresIn  time.Duration
	Metadata   json.RawMessage // a JSON object, or nil
	// IdempotencyScope and IdempotencyKey come from the Idempotency-Key
	// header, scoped by the caller's key name.
	IdempotencyScope string
	IdempotencyKey   string
	Actor            string
}

// hash fingerprints the request so that a replay can be told from a
// different request reusing the same external_id or Idempotency-Key.
func (r *CreateRequest) hash() ([]byte, error) {
	meta := []byte("null")
	if len(r.Metadata) > 0 {
		var v any
		if err := json.Unmarshal(r.Metadata, &v); err != nil {
			return nil, paywatch.Errorf(paywatch.CodeInvalidRequest, "metadata is not valid JSON")
		}
		meta, _ = json.Marshal(v) // map keys come out sorted
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte(r.ExternalID), []byte(r.Network.Name), []byte(r.Asset.Symbol),
		[]byte(r.Amount.String()), binary.BigEndian.AppendUint64(nil, uint64(r.ExpiresIn)), meta} {
		h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(part))))
		h.Write(part)
	}
	return h.Sum(nil), nil
}

// Create opens an order dossier. A replay of an earlier request (same
// Idempotency-Key, or same external_id, with the same content) returns the
// existing order and created=false; the same key or external_id with other
// content is a conflict. Nothing is written when it fails.
func (s *Store) Create(ctx context.Context, req CreateRequest) (order *paywatch.Order, created bool, err error) {
	hash, err := req.hash()
	if err != nil {
		return nil, false, err
	}
	// Insert first: a replay shows up as a unique violation on external_id
	// or Idempotency-Key (its transaction, slot included, rolls back), so a
	// new order costs no look-up.
	id, err := s.insert(ctx, &req, hash)
	if c := pg.Constraint(err); c == "orders_external_id_key" || c == "orders_idempotency_key" {
		// An earlier (or concurrent) request with the same identity.
		o, err := s.replay(ctx, &req, hash)
		if o == nil && err == nil {
			err = fmt.Errorf("order vanished after conflict on %s", c)
		}
		return o, false, err
	}
	if paywatch.ErrorCode(err) == paywatch.CodeNoUniqueAmount {
		// A replay of an order that took the last slot is still a replay.
		if o, rerr := s.replay(ctx, &req, hash); o != nil || rerr != nil {
			return o, false, rerr
		}
	}
	if err != nil {
		return nil, false, err
	}
	o, err := s.Get(ctx, id)
	return o, true, err
}

// replay finds an earlier order with the request's Idempotency-Key or
// external_id and checks it was made by the same request.
func (s *Store) replay(ctx context.Context, req *CreateRequest, hash []byte) (*paywatch.Order, error) {
	var prior struct {
		ID   string `db:"id"`
		Hash []byte `db:"request_hash"`
	}
	if req.IdempotencyKey != "" {
		err := pg.Read(ctx, s.db, func() error {
			return s.db.GetContext(ctx, &prior, `SELECT id, request_hash FROM orders
				WHERE idempotency_scope = $1 AND idempotency_key = $2`, req.IdempotencyScope, req.IdempotencyKey)
		})
		switch {
		case err == nil:
			if !bytes.Equal(prior.Hash, hash) {
				return nil, paywatch.Errorf(paywatch.CodeConflict, "Idempotency-Key %q was used for a different request (order %s)", req.IdempotencyKey, prior.ID)
			}
			return s.Get(ctx, prior.ID)
		case !errors.Is(err, sql.ErrNoRows):
			return nil, fmt.Errorf("look up idempotency key: %w", err)
		}
	}
	err := pg.Read(ctx, s.db, func() error {
		return s.db.GetContext(ctx, &prior, `SELECT id, request_hash FROM orders WHERE external_id = $1`, req.ExternalID)
	})
	switch {
	case err == nil:
		if !bytes.Equal(prior.Hash, hash) {
			return nil, paywatch.Errorf(paywatch.CodeConflict, "external_id %q belongs to order %s, created with a different request", req.ExternalID, prior.ID)
		}
		return s.Get(ctx, prior.ID)
	case !errors.Is(err, sql.ErrNoRows):
		return nil, fmt.Errorf("look up external_id: %w", err)
	}
	return nil, nil
}

func (s *Store) insert(ctx context.Context, req *CreateRequest, hash []byte) (string, error) {
	// With several shared addresses, a first attempt takes whichever
	// address is free right now; if every one is busy, a second waits for
	// one address drawn at random; if that one has no free amount, a third
	// waits for each in turn (see chooseSlot).
	if len(req.Asset.Addresses) < 2 {
		return s.insertOnce(ctx, req, hash, lockAll)
	}
	id, err := s.insertOnce(ctx, req, hash, lockFree)
	if errors.Is(err, errAddressesBusy) {
		id, err = s.insertOnce(ctx, req, hash, lockOne)
	}
	if errors.Is(err, errAddressesBusy) {
		id, err = s.insertOnce(ctx, req, hash, lockAll)
	}
	return id, err
}

// How chooseSlot takes the addresses' locks.
type lockMode int

const (
	lockAll  lockMode = iota // wait for each address in the configured order
	lockFree                 // only addresses free now, from a random one on
	lockOne                  // wait for one address drawn at random
)

func (s *Store) insertOnce(ctx context.Context, req *CreateRequest, hash []byte, mode lockMode) (string, error) {
	id := paywatch.NewID("ord")
	now := s.now()
	expires := now.Add(req.ExpiresIn)
	monitorUntil := expires.Add(s.MonitoringWindow)
	a := req.Asset
	err := pg.Tx(ctx, s.db, func(tx *sqlx.Tx) error {
		o := orderInsert{
			ID: id, ExternalID: req.ExternalID, RequestHash: hash,
			IdempotencyScope: nullString(req.IdempotencyScope), IdempotencyKey: nullString(req.IdempotencyKey),
			Network: req.Network.Name, Asset: a.Symbol, AssetContract: a.Contract,
			Amount: req.Amount.String(), Status: string(paywatch.StatusAwaitingPayment),
			Metadata: nullJSON(req.Metadata), CreatedAt: now, ExpiresAt: expires, MonitorUntil: monitorUntil,
		}
		if req.IdempotencyKey == "" {
			o.IdempotencyScope = nil
		}
		var slot *slotChoice
		switch a.Mode {
		case paywatch.ModeShared:
			var err error
			if slot, err = s.chooseSlot(ctx, tx, a, req.Amount, now, mode); err != nil {
				return err
			}
			o.PayAddress, o.PayAmount, o.UniqueK = slot.address, slot.payAmount.String(), &slot.k
		case paywatch.ModePerOrder:
			if s.Addresses == nil {
				return fmt.Errorf("no address book for %s on %s", a.Symbol, a.Network)
			}
			var index int64
			if err := tx.GetContext(ctx, &index, `INSERT INTO derivation_counters (derivation_key, next_index) VALUES ($1, 1)
				ON CONFLICT (derivation_key) DO UPDATE SET next_index = derivation_counters.next_index + 1
				RETURNING next_index - 1`, a.XPub); err != nil {
				return fmt.Errorf("take derivation index: %w", err)
			}
			addr, err := s.Addresses.Address(a.XPub, uint32(index))
			if err != nil {
				return err
			}
			o.PayAddress, o.PayAmount, o.DerivationKey, o.DerivationIndex = addr, o.Amount, &a.XPub, &index
		default:
			return fmt.Errorf("asset %s on %s has no receiving mode", a.Symbol, a.Network)
		}
		o.EarliestBlockTime = now.Add(-req.Network.Family.BlockTimeSlack())
		// Only transfers in blocks above the height the network has reached
		// can pay the order, as the scanner recorded it (its head and
		// cursor: a node look-up's word does not move it). NULL when nothing
		// is known yet; the scanner fills it in.
		if _, err := tx.NamedExecContext(ctx, `INSERT INTO orders (id, external_id, request_hash, idempotency_scope,
			idempotency_key, network, asset, asset_contract, amount, pay_amount, pay_address, unique_k,
			derivation_key, derivation_index, status, metadata, created_at, expires_at, monitor_until, updated_at,
			created_height, earliest_block_time)
			VALUES (:id, :external_id, :request_hash, :idempotency_scope, :idempotency_key, :network, :asset,
			:asset_contract, :amount, :pay_amount, :pay_address, :unique_k, :derivation_key, :derivation_index,
			:status, :metadata, :created_at, :expires_at, :monitor_until, :created_at,
			(SELECT greatest(c.head, c.block_number) FROM chain_cursors c WHERE c.network = :network),
			:earliest_block_time)`, o); err != nil {
			return fmt.Errorf("insert order: %w", err)
		}
		if slot != nil {
			if err := s.holdSlot(ctx, tx, a, slot, id, monitorUntil, now); err != nil {
				return err
			}
		}
		return AppendEvent(ctx, tx, id, now, EventCreated, "", paywatch.StatusAwaitingPayment, req.Actor, map[string]string{
			"amount": a.FormatAmount(req.Amount), "pay_address": o.PayAddress,
		})
	})
	return id, err
}

type orderInsert struct {
	ID               string    `db:"id"`
	ExternalID       string    `db:"external_id"`
	RequestHash      []byte    `db:"request_hash"`
	IdempotencyScope *string   `db:"idempotency_scope"`
	IdempotencyKey   *string   `db:"idempotency_key"`
	Network          string    `db:"network"`
	Asset            string    `db:"asset"`
	AssetContract    string    `db:"asset_contract"`
	Amount           string    `db:"amount"`
	PayAmount        string    `db:"pay_amount"`
	PayAddress       string    `db:"pay_address"`
	UniqueK          *int      `db:"unique_k"`
	DerivationKey    *string   `db:"derivation_key"`
	DerivationIndex  *int64    `db:"derivation_index"`
	Status           string    `db:"status"`
	Metadata         any       `db:"metadata"`
	CreatedAt        time.Time `db:"created_at"`
	ExpiresAt        time.Time `db:"expires_at"`
	MonitorUntil     time.Time `db:"monitor_until"`
	// EarliestBlockTime bounds how old a block may look and still pay the
	// order, when the recorded head lags.
	EarliestBlockTime time.Time `db:"earliest_block_time"`
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

type slotChoice struct {
	address   string
	k         int
	payAmount *big.Int
}

// errAddressesBusy: no address chooseSlot could lock (lockFree), or the
// one it waited for (lockOne), has a free amount; try the next mode.
var errAddressesBusy = errors.New("every shared address is busy")

// chooseSlot finds, for a shared address that has one, a k whose pay
// amount (amount + k × step) no order holds. k is drawn uniformly at
// random among the free ones (Store.Rand), never the smallest: a customer
// who saw someone else's payment of some amount waiting to be mined must
// not be able to create an order whose pay amount is exactly that.
//
// A transaction-scoped advisory lock per (network, asset, address)
// serialises the creations on one address (the primary key of
// amount_slots is what guarantees uniqueness). With lockFree, the
// addresses are tried from a random one on, each with a lock that does not
// wait: concurrent creations spread over the addresses. With lockOne, a
// new transaction waits for one address drawn at random, holding nothing
// else; with lockAll, one waits for each address in the configured order.
// No transaction ever waits while holding a lock taken out of that order:
// creations cannot deadlock.
func (s *Store) chooseSlot(ctx context.Context, tx *sqlx.Tx, a *paywatch.Asset, amount *big.Int, now time.Time, mode lockMode) (*slotChoice, error) {
	addrs := a.Addresses
	if mode != lockAll {
		start, err := s.rand(len(addrs))
		if err != nil {
			return nil, err
		}
		addrs = append(append([]string{}, addrs[start:]...), addrs[:start]...)
		if mode == lockOne {
			addrs = addrs[:1]
		}
	}
	busy := 0
	for _, addr := range addrs {
		key := "paywatch:slot:" + a.Network + ":" + a.Symbol + ":" + addr
		if mode == lockFree {
			var got bool
			if err := tx.GetContext(ctx, &got, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, key); err != nil {
				return nil, fmt.Errorf("lock amount slots: %w", err)
			}
			if !got {
				busy++
				continue
			}
		} else if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, key); err != nil {
			return nil, fmt.Errorf("lock amount slots: %w", err)
		}
		k, err := freeSlot(ctx, tx, a, addr, amount, now, s.rand)
		if err != nil {
			return nil, err
		}
		if k < 0 {
			continue
		}
		pay := new(big.Int).Mul(big.NewInt(int64(k)), a.UniqueStep)
		pay.Add(pay, amount)
		return &slotChoice{address: addr, k: k, payAmount: pay}, nil
	}
	if busy > 0 || mode == lockOne {
		return nil, errAddressesBusy
	}
	return nil, paywatch.Errorf(paywatch.CodeNoUniqueAmount,
		"all %d unique pay amounts for %s %s on %s are held by other orders; try again later or with another amount",
		a.UniqueSlots, a.FormatAmount(amount), a.Symbol, a.Network)
}

// freeSlot returns a k whose pay amount is not held at addr, drawn
// uniformly among the free ones (draw returns an int in [0, n)), or -1
// when all are held. It reads only the held slots inside the candidate
// range (an index range scan).
func freeSlot(ctx context.Context, tx *sqlx.Tx, a *paywatch.Asset, addr string, amount *big.Int, now time.Time,
	draw func(n int) (int, error)) (int, error) {
	last := new(big.Int).Mul(big.NewInt(int64(a.UniqueSlots-1)), a.UniqueStep)
	last.Add(last, amount)
	var held []string
	if err := tx.SelectContext(ctx, &held, `SELECT pay_amount::text FROM amount_slots
		WHERE network = $1 AND asset = $2 AND address = $3 AND pay_amount BETWEEN $4 AND $5 AND held_until > $6`,
		a.Network, a.Symbol, addr, amount.String(), last.String(), now); err != nil {
		return 0, fmt.Errorf("read held amount slots: %w", err)
	}
	taken := make(map[int64]bool, len(held))
	for _, h := range held {
		v, err := units(h, "held pay amount")
		if err != nil {
			return 0, err
		}
		k, rest := new(big.Int).QuoRem(v.Sub(v, amount), a.UniqueStep, new(big.Int))
		if rest.Sign() == 0 { // another amount's slot between two of ours blocks nothing
			taken[k.Int64()] = true
		}
	}
	free := a.UniqueSlots - len(taken)
	if free <= 0 {
		return -1, nil
	}
	r, err := draw(free)
	if err != nil {
		return 0, err
	}
	for k := 0; k < a.UniqueSlots; k++ { // the r-th free k
		if taken[int64(k)] {
			continue
		}
		if r == 0 {
			return k, nil
		}
		r--
	}
	return -1, nil
}

// holdSlot records the chosen slot until the order's monitoring window
// ends, taking over a slot whose previous holder's window has ended.
func (s *Store) holdSlot(ctx context.Context, tx *sqlx.Tx, a *paywatch.Asset, slot *slotChoice, orderID string, until, now time.Time) error {
	res, err := tx.ExecContext(ctx, `INSERT INTO amount_slots (network, asset, address, pay_amount, order_id, held_until)
		VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (network, asset, address, pay_amount) DO UPDATE
		SET order_id = EXCLUDED.order_id, held_until = EXCLUDED.held_until
		WHERE amount_slots.held_until <= $7`,
		a.Network, a.Symbol, slot.address, slot.payAmount.String(), orderID, until, now)
	if err != nil {
		return fmt.Errorf("hold amount slot: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		// Cannot happen under the advisory lock; never hand out a duplicate.
		return fmt.Errorf("amount slot %s at %s was taken concurrently", slot.payAmount, slot.address)
	}
	return nil
}
