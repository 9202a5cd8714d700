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
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

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
	// or Idempotency-Key, or on a shared address is found before a slot is
	// drawn (errReplay, in a statement the creation runs anyway); its
	// transaction rolls back. A new order costs no look-up of its own.
	id, err := s.insert(ctx, &req, hash)
	if c := pg.Constraint(err); c == "orders_external_id_key" || c == "orders_idempotency_key" || errors.Is(err, errReplay) {
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

// insert writes a new order in a transaction of its own. A shared
// address's slot that a creation committing at the same moment took (see
// holdSlot) sends it round again, with a fresh draw.
//
// At most maxCreating creations of a store are in the database at once;
// the others wait their turn, first come first served. A burst of
// checkouts then neither takes every pooled connection (the reads of
// order pages, the webhooks and the reconciler keep theirs) nor waits on
// the pool, which hands its connections out in no particular order: 1,000
// creations at once had half the slowest wait with the turns (p99) as
// without, for as many a second.
func (s *Store) insert(ctx context.Context, req *CreateRequest, hash []byte) (string, error) {
	if s.creating != nil {
		select {
		case s.creating <- struct{}{}:
			defer func() { <-s.creating }()
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	races := 0
	var busy []string // the addresses with room an earlier release held, to wait for in turn
	for wait := -1; ; {
		waitFor := ""
		if wait >= 0 {
			waitFor = busy[wait]
		}
		id, err := s.insertOnce(ctx, req, hash, waitFor)
		s.prepareMissed(ctx) // outside the transaction
		var b busyError
		switch {
		case errors.Is(err, errSlotTaken):
			if races++; races == maxSlotAttempts {
				return "", paywatch.Errorf(paywatch.CodeNoUniqueAmount,
					"the pay amounts drawn for %s %s on %s were taken by creations at the same moment, %d times; try again",
					req.Asset.FormatAmount(req.Amount), req.Asset.Symbol, req.Asset.Network, maxSlotAttempts)
			}
		case errors.As(err, &b) && wait < 0 && len(b.addrs) > 0:
			// Each address with room was held by a daemon of an earlier
			// release: wait for those, one at a time from one drawn at
			// random, each in a transaction of its own that holds no other
			// address.
			start, err := s.rand(len(b.addrs))
			if err != nil {
				return "", err
			}
			busy, wait = append(append([]string{}, b.addrs[start:]...), b.addrs[:start]...), 0
		case errors.As(err, &b) && wait >= 0:
			if wait++; wait == len(busy) {
				return "", noUniqueAmount(req.Asset, req.Amount)
			}
		default:
			return id, err
		}
	}
}

// maxCreating is how many creations a store runs in the database at once:
// enough to keep both the database's cores and its group commit busy.
const maxCreating = 8

// maxSlotAttempts bounds the transactions one creation tries when the
// slot it drew was taken under it (each time by a creation that committed
// the same slot in the moment between two statements).
const maxSlotAttempts = 5

// insertOnce tries a creation in one transaction. On a shared address,
// with wait "" it tries every address with room, waiting for none; else
// it waits for that address alone (chooseSlot).
func (s *Store) insertOnce(ctx context.Context, req *CreateRequest, hash []byte, wait string) (string, error) {
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
		if err := lockIdentity(ctx, s.prepared(tx), req); err != nil {
			return err
		}
		var slot *slotChoice
		switch a.Mode {
		case paywatch.ModeShared:
			var err error
			if slot, err = s.chooseSlot(ctx, tx, req, now, wait); err != nil {
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

// lockIdentity takes, inside tx and waiting for them, the locks of the
// request's identity: its external_id, then its Idempotency-Key. A retry
// sent while its original is still in its transaction waits for it here,
// holding nothing else, then finds it (chooseSlot, or the unique
// violation) and answers it. Creations of different identities never wait
// for each other here; the two locks are always taken in this order.
func lockIdentity(ctx context.Context, tx preparedTx, req *CreateRequest) error {
	idem := ""
	if req.IdempotencyKey != "" {
		idem = fmt.Sprintf("paywatch:order:idempotency:%d:%s:%s", len(req.IdempotencyScope), req.IdempotencyScope, req.IdempotencyKey)
	}
	// CASE evaluates its conditions in order, and a volatile one is never
	// folded away: the external_id's lock, then, once it is taken, the
	// key's.
	if _, err := tx.ExecContext(ctx, `SELECT CASE WHEN pg_advisory_xact_lock(hashtextextended($1, 0))::text IS NULL THEN NULL
		WHEN $2 <> '' THEN pg_advisory_xact_lock(hashtextextended($2, 0))::text END`,
		"paywatch:order:external_id:"+req.ExternalID, idem); err != nil {
		return fmt.Errorf("lock the order's identity: %w", err)
	}
	return nil
}

// preparedTx runs a creation's slot statements in its transaction, each
// prepared once per pooled connection (Store.statement): they are planned
// on every creation otherwise, which was a third of the database's time
// for one. A statement not prepared yet runs as it is, and is prepared
// once the transaction is over (Store.prepareMissed): a creation holds its
// transaction's connection, and one that waited for another connection to
// prepare on would wait forever once every connection of the pool was
// held by a creation doing the same.
type preparedTx struct {
	tx *sqlx.Tx
	s  *Store
}

func (s *Store) prepared(tx *sqlx.Tx) preparedTx { return preparedTx{tx: tx, s: s} }

func (p preparedTx) GetContext(ctx context.Context, dest any, query string, args ...any) error {
	if stmt := p.s.cached(query); stmt != nil {
		return p.tx.StmtxContext(ctx, stmt).GetContext(ctx, dest, args...)
	}
	return p.tx.GetContext(ctx, dest, query, args...)
}

func (p preparedTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if stmt := p.s.cached(query); stmt != nil {
		return p.tx.StmtxContext(ctx, stmt).ExecContext(ctx, args...)
	}
	return p.tx.ExecContext(ctx, query, args...)
}

// cached returns query as prepared on the store's database, or nil when
// it is not yet, noting it for prepareMissed.
func (s *Store) cached(query string) *sqlx.Stmt {
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	stmt := s.stmts[query]
	if stmt == nil {
		if s.missed == nil {
			s.missed = map[string]bool{}
		}
		s.missed[query] = true
	}
	return stmt
}

// prepareMissed prepares the statements cached found missing. It takes a
// connection of the pool: never call it holding one (in a transaction).
func (s *Store) prepareMissed(ctx context.Context) {
	s.stmtMu.Lock()
	var queries []string
	for q := range s.missed {
		queries = append(queries, q)
	}
	clear(s.missed)
	s.stmtMu.Unlock()
	for _, q := range queries {
		if _, err := s.statement(ctx, q); err != nil {
			return // the next use notes it missing again
		}
	}
}

// statement returns query prepared on the store's database, preparing it
// first if it is not yet. Preparing takes a connection of the pool: never
// call it holding one (in a transaction), and no lock is held meanwhile.
func (s *Store) statement(ctx context.Context, query string) (*sqlx.Stmt, error) {
	s.stmtMu.Lock()
	stmt := s.stmts[query]
	s.stmtMu.Unlock()
	if stmt != nil {
		return stmt, nil
	}
	stmt, err := s.db.PreparexContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if prior := s.stmts[query]; prior != nil {
		stmt.Close() // prepared meanwhile by another request
		return prior, nil
	}
	if s.stmts == nil {
		s.stmts = map[string]*sqlx.Stmt{}
	}
	s.stmts[query] = stmt
	return stmt, nil
}

// errReplay: an order with the request's identity exists; Create answers
// it (replay).
var errReplay = errors.New("an order with this identity exists")

// errAddressBusy: an earlier release holds the address (lockFreeSlot).
var errAddressBusy = errors.New("the shared address is busy")

// busyError: every address with room (addrs) was held by a daemon of an
// earlier release (addressLockKey); insert waits for them in turn.
type busyError struct{ addrs []string }

func (e busyError) Error() string {
	return fmt.Sprintf("%d shared addresses with room are busy", len(e.addrs))
}

// addressLockKey names the lock of a shared address. Each creation holds
// it in shared mode on the address it takes a slot at (lockFreeSlot); a
// daemon of an earlier release held it exclusively for each creation, and
// so takes turns with this one's (during a rolling upgrade, neither writes
// a slot the other is writing, nor waits on the other's rows).
func addressLockKey(a *paywatch.Asset, addr string) string {
	return "paywatch:slot:" + a.Network + ":" + a.Symbol + ":" + addr
}

func noUniqueAmount(a *paywatch.Asset, amount *big.Int) error {
	return paywatch.Errorf(paywatch.CodeNoUniqueAmount,
		"all %d unique pay amounts for %s %s on %s are held by other orders; try again later or with another amount",
		a.UniqueSlots, a.FormatAmount(amount), a.Symbol, a.Network)
}

type slotChoice struct {
	address   string
	k         int
	payAmount *big.Int
}

// errSlotTaken: the slot chosen was committed by another creation in the
// moment between chooseSlot's read and its lock (holdSlot).
var errSlotTaken = errors.New("the amount slot was taken by a creation committing at the same moment")

// chooseSlot finds, for a shared address that has one, a k whose pay
// amount (amount + k × step) no order holds, and takes that slot's lock
// for the rest of tx. k is drawn uniformly at random among the free ones
// (Store.Rand), never the smallest: a customer who saw someone else's
// payment of some amount waiting to be mined must not be able to create an
// order whose pay amount is exactly that. With several addresses, the
// search starts at one drawn at random, so that creations spread over
// them; when the first has no slot to give, one statement finds which of
// the others have room, and only those are visited.
//
// The primary key of amount_slots is what guarantees uniqueness (holdSlot).
// The lock is a transaction-scoped advisory lock per slot, taken without
// waiting: two creations drawing the same slot at once never both write
// it, the second takes another, and creations on one address run side by
// side instead of one at a time. Nothing ever waits for a slot's lock.
//
// The address a slot is taken at is also locked, in shared mode
// (addressLockKey): without waiting when wait is "", an address held
// exclusively being passed over as busy (busyError when no other had
// room); waiting, for the address wait alone, in a transaction that holds
// no other address. No creation waits for an address while holding
// another: none deadlocks with an earlier release's, whatever order each
// lists the addresses in.
func (s *Store) chooseSlot(ctx context.Context, tx *sqlx.Tx, req *CreateRequest, now time.Time, wait string) (*slotChoice, error) {
	a, amount := req.Asset, req.Amount
	addrs := a.Addresses
	switch {
	case wait != "":
		addrs = []string{wait}
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))`,
			addressLockKey(a, wait)); err != nil {
			return nil, fmt.Errorf("wait for address %s: %w", wait, err)
		}
	case len(addrs) > 1:
		start, err := s.rand(len(addrs))
		if err != nil {
			return nil, err
		}
		addrs = append(append([]string{}, addrs[start:]...), addrs[:start]...)
	}
	var busy []string
	for i := 0; i < len(addrs); i++ {
		addr := addrs[i]
		if i == 1 && len(addrs) > 2 {
			// The first address had no slot to give: of the others, visit
			// only those with room.
			rest, err := withRoom(ctx, s.prepared(tx), req, addrs[1:], now)
			if err != nil {
				return nil, err
			}
			addrs = append(addrs[:1], rest...)
			if len(addrs) == 1 {
				break
			}
			addr = addrs[1]
		}
		k, err := lockFreeSlot(ctx, s.prepared(tx), req, addr, now, s.rand, i == 0)
		switch {
		case errors.Is(err, errAddressBusy):
			busy = append(busy, addr)
			continue
		case err != nil:
			return nil, err
		case k < 0:
			continue
		}
		return &slotChoice{address: addr, k: k, payAmount: payAmount(a, amount, k)}, nil
	}
	if len(busy) > 0 || wait != "" {
		return nil, busyError{addrs: busy}
	}
	return nil, noUniqueAmount(a, amount)
}

// withRoom returns addrs without those whose every slot for the amount is
// held, in their order, in one statement (an asset may list thousands of
// addresses, most of them full).
func withRoom(ctx context.Context, tx preparedTx, req *CreateRequest, addrs []string, now time.Time) ([]string, error) {
	a, amount := req.Asset, req.Amount
	var full pq.StringArray
	if err := tx.GetContext(ctx, &full, `SELECT ARRAY(SELECT address FROM amount_slots
			WHERE network = $1 AND asset = $2 AND address = ANY($3) AND pay_amount BETWEEN $4 AND $5 AND held_until > $6
				AND (pay_amount - $4) % $7 = 0
			GROUP BY address HAVING count(*) >= $8)`,
		a.Network, a.Symbol, pq.Array(addrs), amount.String(), payAmount(a, amount, a.UniqueSlots-1).String(), now,
		a.UniqueStep.String(), a.UniqueSlots); err != nil {
		return nil, fmt.Errorf("find the addresses with room: %w", err)
	}
	return slices.DeleteFunc(addrs, func(addr string) bool { return slices.Contains(full, addr) }), nil
}

// replaySQL says whether an order with the identity $1 (external_id), $2,
// $3 (Idempotency-Key's scope and key) exists.
const replaySQL = `(EXISTS (SELECT 1 FROM orders WHERE external_id = $1)
	OR EXISTS (SELECT 1 FROM orders WHERE idempotency_scope = $2 AND idempotency_key = $3))`

// payAmount is the pay amount of slot k for amount: amount + k × step.
func payAmount(a *paywatch.Asset, amount *big.Int, k int) *big.Int {
	pay := new(big.Int).Mul(big.NewInt(int64(k)), a.UniqueStep)
	return pay.Add(pay, amount)
}

// slotCandidates is how many free slots one statement of lockFreeSlot
// tries, in the order drawn: a slot another creation holds the lock of is
// passed over for the next without another round trip.
const slotCandidates = 8

// lockFreeSlot returns a k whose pay amount is not held at addr, drawn
// uniformly among the free ones (draw returns an int in [0, n)), with its
// slot's lock taken inside tx; or -1 when every slot is held, or locked by
// a creation in flight. It reads only the held slots inside the candidate
// range (an index range scan), then tries drawn candidates, a few per
// statement.
func lockFreeSlot(ctx context.Context, tx preparedTx, req *CreateRequest, addr string, now time.Time,
	draw func(n int) (int, error), first bool) (int, error) {
	a, amount := req.Asset, req.Amount
	// The held slots; and, at the first address visited, whether an order
	// with the request's identity exists (a retry whose original
	// committed, waited for by lockIdentity: it takes no slot).
	var r struct {
		Replay bool           `db:"replay"`
		Held   pq.StringArray `db:"held"`
	}
	if err := tx.GetContext(ctx, &r, `SELECT $10::bool AND `+replaySQL+` AS replay,
		ARRAY(SELECT pay_amount::text FROM amount_slots
			WHERE network = $4 AND asset = $5 AND address = $6 AND pay_amount BETWEEN $7 AND $8 AND held_until > $9) AS held`,
		req.ExternalID, req.IdempotencyScope, req.IdempotencyKey, a.Network, a.Symbol, addr, amount.String(),
		payAmount(a, amount, a.UniqueSlots-1).String(), now, first); err != nil {
		return 0, fmt.Errorf("read held amount slots: %w", err)
	}
	if r.Replay {
		return 0, errReplay
	}
	held := r.Held
	taken := make(map[int]bool, len(held))
	for _, h := range held {
		v, err := units(h, "held pay amount")
		if err != nil {
			return 0, err
		}
		k, rest := new(big.Int).QuoRem(v.Sub(v, amount), a.UniqueStep, new(big.Int))
		if rest.Sign() == 0 { // another amount's slot between two of ours blocks nothing
			taken[int(k.Int64())] = true
		}
	}
	key := addressLockKey(a, addr) + ":"
	for {
		ks, err := drawFree(a.UniqueSlots, taken, slotCandidates, draw)
		if err != nil || len(ks) == 0 {
			return -1, err
		}
		pays := make([]string, len(ks))
		for i, k := range ks {
			pays[i] = payAmount(a, amount, k).String()
		}
		// The address's lock in shared mode, without waiting (taken only
		// at an address with room: a creation holds one address's), then
		// the first candidate, in the order drawn, that no one holds and
		// whose lock is free, taking that lock and no other: the look-up
		// of the held ones comes first, ordered and fenced (OFFSET 0), so
		// that whatever plan the look-up gets, the locks are tried one
		// candidate at a time, in the order drawn, until one is taken. A
		// holder that committed after this statement's snapshot is caught
		// by holdSlot.
		var pick struct {
			Free bool   `db:"free"`
			N    *int64 `db:"n"`
		}
		if err := tx.GetContext(ctx, &pick, `WITH addr AS (SELECT pg_try_advisory_xact_lock_shared(hashtextextended($7, 0)) AS free)
			SELECT addr.free, CASE WHEN addr.free THEN (SELECT c.n FROM (
					SELECT u.pay, u.n FROM unnest($4::text[]) WITH ORDINALITY AS u(pay, n)
					WHERE NOT EXISTS (SELECT 1 FROM amount_slots s WHERE s.network = $1 AND s.asset = $2 AND s.address = $3
						AND s.pay_amount = u.pay::numeric AND s.held_until > $5)
					ORDER BY u.n OFFSET 0) c
				WHERE pg_try_advisory_xact_lock(hashtextextended($6 || c.pay, 0))
				LIMIT 1) END AS n
			FROM addr`, a.Network, a.Symbol, addr, pq.Array(pays), now, key, addressLockKey(a, addr)); err != nil {
			return 0, fmt.Errorf("lock an amount slot: %w", err)
		}
		switch {
		case !pick.Free:
			return 0, errAddressBusy
		case pick.N != nil:
			return ks[*pick.N-1], nil
		}
		for _, k := range ks { // each held, or being taken by a creation in flight
			taken[k] = true
		}
	}
}

// drawFree draws up to c distinct ks in [0, slots) outside taken, each
// uniformly among those left (draw returns an int in [0, n)), in the order
// drawn. It costs the sort of taken, not a walk over the slots (which may
// be a million).
func drawFree(slots int, taken map[int]bool, c int, draw func(n int) (int, error)) ([]int, error) {
	held := make([]int, 0, len(taken))
	for k := range taken {
		if k >= 0 && k < slots {
			held = append(held, k)
		}
	}
	slices.Sort(held)
	free := slots - len(held)
	// The j-th draw is a rank among the free ks not drawn yet; as a rank
	// among all the free ks, it is moved past each earlier draw at or
	// below it.
	ranks := make([]int, 0, min(c, free))
	sorted := make([]int, 0, cap(ranks))
	for j := 0; j < c && j < free; j++ {
		r, err := draw(free - j)
		if err != nil {
			return nil, err
		}
		for _, p := range sorted {
			if p > r {
				break
			}
			r++
		}
		ranks = append(ranks, r)
		i, _ := slices.BinarySearch(sorted, r)
		sorted = slices.Insert(sorted, i, r)
	}
	// The free k of rank r is r moved past each held k at or below it;
	// the ranks in ascending order walk held once.
	at := make(map[int]int, len(ranks))
	i := 0
	for _, r := range sorted {
		k := r + i
		for i < len(held) && held[i] <= k {
			i++
			k++
		}
		at[r] = k
	}
	ks := make([]int, len(ranks))
	for j, r := range ranks {
		ks[j] = at[r]
	}
	return ks, nil
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
		// A creation that held the slot's lock committed it between
		// chooseSlot's snapshot and its lock: never a duplicate, a new
		// draw in a new transaction.
		return fmt.Errorf("amount slot %s at %s: %w", slot.payAmount, slot.address, errSlotTaken)
	}
	return nil
}
