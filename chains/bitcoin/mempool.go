package bitcoin

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/btcsuite/btcd/wire"
	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
)

// Mempool watches a node's mempool for payments to watched addresses, so
// that an order shows "payment detected" seconds after the customer pays,
// long before a block holds the payment. What it records never pays
// anything: the reconciler shows it and withdraws it when the transaction
// is replaced or dropped.
//
// Each step reads the mempool's txids (getrawmempool), then the node's
// height, then the transactions not inspected before (getrawtransaction,
// raw, in batches). A watched transaction missing from the mempool is
// recorded with that height: once the scanner has passed it, the
// reconciler knows whether it was mined (it is a transfer), replaced (a
// transaction seen spending one of its inputs) or dropped.
type Mempool struct {
	src *Source
	db  *sqlx.DB
	log *slog.Logger
	// Now is the clock; tests replace it.
	Now func() time.Time
	// Interval is the time between steps; MaxFetch bounds the transactions
	// one step reads (a node's first mempool may hold hundreds of
	// thousands: the rest are read by the steps that follow at once).
	Interval time.Duration
	MaxFetch int

	// known are the txids of the last mempool read, already inspected;
	// tracked the watched transactions not missing, with the outpoints
	// they spend.
	known   map[string]struct{}
	tracked map[string][]string
	loaded  bool
}

// DefaultMempoolInterval is the time between mempool reads, unless the
// network is polled more often (mempoolInterval).
const DefaultMempoolInterval = 2 * time.Second

// minMempoolInterval is the shortest time between mempool reads (the
// shortest poll_interval allowed).
const minMempoolInterval = 100 * time.Millisecond

// mempoolInterval is the time between mempool reads on a network polled
// every poll: DefaultMempoolInterval, or poll if shorter. A network with
// no poll interval set reads every DefaultMempoolInterval.
func mempoolInterval(poll time.Duration) time.Duration {
	if poll <= 0 {
		return DefaultMempoolInterval
	}
	return min(DefaultMempoolInterval, max(poll, minMempoolInterval))
}

// mempoolBatch is how many raw transactions one request reads.
const mempoolBatch = 250

// NewMempool returns a mempool watcher reading through src's nodes and
// watch set, recording into db, every DefaultMempoolInterval or the
// network's poll interval if shorter.
func NewMempool(src *Source, db *sqlx.DB, log *slog.Logger) *Mempool {
	return &Mempool{src: src, db: db, log: log.With("network", src.network.Name, "watcher", "mempool"), Now: time.Now,
		Interval: mempoolInterval(src.network.PollInterval), MaxFetch: 20 * mempoolBatch}
}

// Run steps until ctx ends; errors are logged and retried at the next
// interval (the mempool is a courtesy view: the scanner is what counts).
func (m *Mempool) Run(ctx context.Context) error {
	m.loaded = false // another instance may have held the lease meanwhile
	failures := 0
	for {
		more, err := m.Step(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := m.Interval
		switch {
		case err != nil:
			failures++
			if failures == 1 || failures%30 == 0 {
				m.log.Warn("mempool read failed", "err", err, "failures", failures)
			}
		case more:
			failures, wait = 0, 0
		default:
			failures = 0
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// sighting is a watched output of a transaction in the mempool.
type sighting struct {
	txid   string
	vout   int
	to     string
	amount *big.Int
	flags  []string
	spends []string
}

// Step reads the mempool once and records what changed. It reports
// whether transactions are left to inspect (MaxFetch was reached).
func (m *Mempool) Step(ctx context.Context) (more bool, err error) {
	network := m.src.network.Name
	if !m.loaded {
		if err := m.load(ctx); err != nil {
			return false, err
		}
	}
	if err := m.src.watch.Refresh(ctx); err != nil {
		return false, err
	}
	var ids []string
	var height int64
	info := struct {
		Loaded *bool `json:"loaded"` // Bitcoin Core: false while mempool.dat is read at start
	}{}
	// The mempool first, then the height, in one batch the node runs in
	// order: a block that took a transaction out of the mempool is at or
	// below the height read after.
	err = m.src.nodes.Call(ctx, func(ctx context.Context, c *client) error {
		// Nothing of an attempt that failed (another node's, or a dropped
		// connection's) is kept.
		info.Loaded, ids, height = nil, nil, 0
		calls := []*call{{Method: "getmempoolinfo", Result: &info}, {Method: "getrawmempool", Params: []any{false}, Result: &ids},
			{Method: "getblockcount", Result: &height}}
		if err := c.do(ctx, calls); err != nil {
			return err
		}
		for _, cl := range calls[1:] {
			if cl.Err != nil {
				return fmt.Errorf("%s: %w", cl.Method, cl.Err)
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("read the mempool: %w", err)
	}
	if info.Loaded != nil && !*info.Loaded {
		return false, nil // a node still loading its mempool would withdraw everything
	}
	current := make(map[string]struct{}, len(ids))
	var fresh []string
	for _, id := range ids {
		current[id] = struct{}{}
		if _, ok := m.known[id]; !ok && ValidTxHash(id) {
			fresh = append(fresh, id)
		}
	}
	if len(fresh) > m.MaxFetch {
		fresh, more = fresh[:m.MaxFetch], true
	}
	txs, err := m.fetch(ctx, fresh)
	if err != nil {
		return false, err
	}
	var seen []sighting
	replaced := map[string]string{} // tracked txid → the txid spending one of its inputs
	spentBy := map[string]string{}  // outpoint → tracked txid
	for txid, spends := range m.tracked {
		for _, op := range spends {
			spentBy[op] = txid
		}
	}
	for txid, tx := range txs {
		var spends []string
		for _, in := range tx.TxIn {
			op := in.PreviousOutPoint.String()
			spends = append(spends, op)
			if other, ok := spentBy[op]; ok && other != txid {
				replaced[other] = txid
			}
		}
		for i, out := range tx.TxOut {
			if out.Value <= 0 || !m.src.watch.Has(out.PkScript) {
				continue
			}
			s := sighting{txid: txid, vout: i, to: m.src.address(out.PkScript), amount: big.NewInt(out.Value), spends: spends}
			if d := m.src.asset.Dust; d != nil && s.amount.Cmp(d) < 0 {
				s.flags = []string{"dust"}
			}
			seen = append(seen, s)
		}
	}
	var gone []string
	for txid := range m.tracked {
		if _, ok := current[txid]; !ok {
			gone = append(gone, txid)
		}
	}
	if len(seen) > 0 || len(gone) > 0 || len(replaced) > 0 {
		if err := m.record(ctx, network, uint64(height), seen, gone, replaced); err != nil {
			return false, err
		}
		if len(seen) > 0 {
			m.log.Info("payments seen in the mempool", "outputs", len(seen))
		}
	}
	// Only now that it is recorded: a failed step reads it all again.
	known := make(map[string]struct{}, len(current))
	for id := range m.known {
		if _, ok := current[id]; ok {
			known[id] = struct{}{}
		}
	}
	for txid := range txs {
		known[txid] = struct{}{}
	}
	for _, id := range fresh {
		if _, ok := txs[id]; !ok {
			known[id] = struct{}{} // gone before it could be read: nothing to see
		}
	}
	m.known = known
	for _, txid := range gone {
		delete(m.tracked, txid)
	}
	for _, s := range seen {
		m.tracked[s.txid] = s.spends
	}
	return more, nil
}

// load reads the watched transactions still in the mempool as last seen.
func (m *Mempool) load(ctx context.Context) error {
	var rows []struct {
		TxHash string         `db:"tx_hash"`
		Spends pq.StringArray `db:"spends"`
	}
	if err := m.db.SelectContext(ctx, &rows, `SELECT DISTINCT ON (tx_hash) tx_hash, spends FROM mempool_transfers
		WHERE network = $1 AND left_at IS NULL AND missing_at_height IS NULL`, m.src.network.Name); err != nil {
		return fmt.Errorf("read the mempool's watched transactions: %w", err)
	}
	m.tracked = make(map[string][]string, len(rows))
	for _, r := range rows {
		m.tracked[r.TxHash] = r.Spends
	}
	m.known = map[string]struct{}{}
	m.loaded = true
	return nil
}

// fetch reads raw transactions by txid; those the node no longer has, and
// those it cannot send or the watcher cannot read, are left out.
func (m *Mempool) fetch(ctx context.Context, ids []string) (map[string]*wire.MsgTx, error) {
	out := make(map[string]*wire.MsgTx, len(ids))
	for start := 0; start < len(ids); start += mempoolBatch {
		if err := m.fetchPart(ctx, ids[start:min(start+mempoolBatch, len(ids))], out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fetchPart reads one request's worth of raw transactions into out. An
// answer too large (a batch of big transactions) is read again in halves;
// a single transaction too large is skipped.
func (m *Mempool) fetchPart(ctx context.Context, part []string, out map[string]*wire.MsgTx) error {
	raws := make([]string, len(part))
	err := m.src.nodes.Call(ctx, func(ctx context.Context, c *client) error {
		calls := make([]*call, len(part))
		for i, id := range part {
			calls[i] = &call{Method: "getrawtransaction", Params: []any{id, 0}, Result: &raws[i]}
		}
		if err := c.do(ctx, calls); err != nil {
			return err
		}
		for i, cl := range calls {
			if cl.Err != nil && !noTx(cl.Err) {
				return fmt.Errorf("getrawtransaction %s: %w", part[i], cl.Err)
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, errAnswerTooLarge) && len(part) > 1:
		half := len(part) / 2
		if err := m.fetchPart(ctx, part[:half], out); err != nil {
			return err
		}
		return m.fetchPart(ctx, part[half:], out)
	case errors.Is(err, errAnswerTooLarge):
		m.log.Warn("skipping a mempool transaction too large to read", "txid", part[0])
		return nil
	case err != nil:
		return fmt.Errorf("read mempool transactions: %w", err)
	}
	for i, raw := range raws {
		if raw == "" {
			continue
		}
		tx, err := decodeTx(raw, part[i])
		if err != nil {
			// Not one the watcher can read: skipped (as known), so that
			// it does not stop every later read.
			m.log.Warn("skipping a mempool transaction", "txid", part[i], "err", err)
			continue
		}
		out[part[i]] = tx
	}
	return nil
}

// decodeTx decodes a raw transaction and checks it is the one asked for.
func decodeTx(raw, txid string) (*wire.MsgTx, error) {
	data, err := hex.DecodeString(raw)
	if err != nil {
		return nil, fmt.Errorf("raw transaction %s is not hex: %w", txid, err)
	}
	var tx wire.MsgTx
	if err := tx.Deserialize(bytes.NewReader(data)); err != nil {
		return nil, fmt.Errorf("decode raw transaction %s: %w", txid, err)
	}
	if got := tx.TxHash().String(); got != txid {
		return nil, fmt.Errorf("the node sent transaction %s for %s", got, txid)
	}
	return &tx, nil
}

// record writes one step in one transaction: new sightings (a transaction
// back in the mempool after a reorg or a re-broadcast is seen again, and
// matched again under the rules),
// transactions missing since height, replacements; and wakes the
// reconciler.
func (m *Mempool) record(ctx context.Context, network string, height uint64, seen []sighting, gone []string, replaced map[string]string) error {
	now := m.Now().UTC().Truncate(time.Microsecond)
	return pg.Tx(ctx, m.db, func(tx *sqlx.Tx) error {
		if err := pg.LockSightings(ctx, tx); err != nil {
			return err
		}
		if len(seen) > 0 {
			// One statement for all: the sightings' lock is held while it
			// runs. Flags and spent outpoints travel comma-joined (neither
			// holds a comma).
			n := len(seen)
			ids, txids, keys, vouts, tos := make([]string, n), make([]string, n), make([]string, n), make([]int64, n), make([]string, n)
			amounts, flags, spends := make([]string, n), make([]string, n), make([]string, n)
			made := time.Now()
			for i, s := range seen {
				ids[i], txids[i], keys[i], vouts[i], tos[i] = paywatch.NewSortableID("mpt", made), s.txid, "vout:"+strconv.Itoa(s.vout), int64(s.vout), s.to
				amounts[i], flags[i], spends[i] = s.amount.String(), strings.Join(s.flags, ","), strings.Join(s.spends, ",")
			}
			if _, err := tx.ExecContext(ctx, `
				INSERT INTO mempool_transfers (id, network, asset, tx_hash, tx_key, idx, to_address, amount, flags, spends,
					first_seen_at, updated_at)
				SELECT id, $1, $2, tx_hash, tx_key, idx, to_address, amount::numeric,
					coalesce(string_to_array(NULLIF(flags, ''), ','), '{}'), coalesce(string_to_array(NULLIF(spends, ''), ','), '{}'), $3, $3
				FROM unnest($4::text[], $5::text[], $6::text[], $7::bigint[], $8::text[], $9::text[], $10::text[], $11::text[])
					AS u(id, tx_hash, tx_key, idx, to_address, amount, flags, spends)
				ON CONFLICT (network, tx_hash, tx_key) DO UPDATE SET missing_at_height = NULL, missing_since = NULL, left_at = NULL,
					left_reason = NULL, replaced_by = NULL, order_id = NULL, dirty = true, updated_at = $3
				WHERE mempool_transfers.missing_at_height IS NOT NULL OR mempool_transfers.left_at IS NOT NULL`,
				network, m.src.asset.Symbol, now, pq.Array(ids), pq.Array(txids), pq.Array(keys), pq.Array(vouts), pq.Array(tos),
				pq.Array(amounts), pq.Array(flags), pq.Array(spends)); err != nil {
				return fmt.Errorf("record %d mempool payments: %w", n, err)
			}
		}
		if len(gone) > 0 {
			// At the node's height, or the scanner's if it is ahead (a
			// failover to a node behind must not shorten the wait).
			if _, err := tx.ExecContext(ctx, `UPDATE mempool_transfers SET missing_at_height = greatest($3,
					coalesce((SELECT block_number FROM chain_cursors WHERE network = $1), 0)), missing_since = $4,
					dirty = true, updated_at = $4
				WHERE network = $1 AND tx_hash = ANY($2) AND left_at IS NULL AND missing_at_height IS NULL`,
				network, pq.Array(gone), int64(height), now); err != nil {
				return fmt.Errorf("record payments gone from the mempool: %w", err)
			}
		}
		if len(replaced) > 0 {
			var olds, bys []string
			for old, by := range replaced {
				olds, bys = append(olds, old), append(bys, by)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE mempool_transfers m SET replaced_by = r.by, updated_at = $2
				FROM unnest($3::text[], $4::text[]) AS r(old, by)
				WHERE m.network = $1 AND m.tx_hash = r.old AND m.left_at IS NULL`, network, now, pq.Array(olds), pq.Array(bys)); err != nil {
				return fmt.Errorf("record %d replacements: %w", len(olds), err)
			}
		}
		_, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, pg.NotifyChannel, network)
		return err
	})
}
