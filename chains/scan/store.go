package scan

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/migrations/pg"
)

// Store keeps what the scanners see in PostgreSQL: cursors, recent block
// hashes, transfers and reorgs.
type Store struct {
	db  *sqlx.DB
	Now func() time.Time
	// Log receives what the store ignores on purpose; nil for none.
	Log *slog.Logger
}

func (s *Store) warn(msg string, args ...any) {
	if s.Log != nil {
		s.Log.Warn(msg, args...)
	}
}

// NewStore returns a Store over db.
func NewStore(db *sqlx.DB) *Store { return &Store{db: db, Now: time.Now} }

// ErrCursorMoved means another scanner advanced the cursor meanwhile; the
// batch was not written.
var ErrCursorMoved = errors.New("cursor moved under the scanner (another instance is scanning)")

// NotifyChannel is the PostgreSQL channel a commit notifies with the
// network's name, so that the reconciler reacts without waiting.
const NotifyChannel = pg.NotifyChannel

type cursorRow struct {
	Number *int64  `db:"block_number"`
	Hash   *string `db:"block_hash"`
	Head   *int64  `db:"head"`
	Halted bool    `db:"halted"`
	First  *int64  `db:"first_block"`
}

// FirstBlock returns the block a network's scanning began at, if known.
func (s *Store) FirstBlock(ctx context.Context, network string) (uint64, bool, error) {
	var first *int64
	err := s.db.GetContext(ctx, &first, `SELECT first_block FROM chain_cursors WHERE network = $1`, network)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && first == nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read first block of %s: %w", network, err)
	}
	return uint64(*first), true, nil
}

// Cursor returns the last scanned block of network (nil before the first
// batch) and whether the scanner was halted by a reorg too deep to handle.
func (s *Store) Cursor(ctx context.Context, network string) (*Block, bool, error) {
	var r cursorRow
	err := s.db.GetContext(ctx, &r, `SELECT block_number, block_hash, halted, first_block FROM chain_cursors WHERE network = $1`, network)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read cursor of %s: %w", network, err)
	}
	if r.Number == nil || r.Hash == nil {
		return nil, r.Halted, nil
	}
	return &Block{Number: uint64(*r.Number), Hash: *r.Hash}, r.Halted, nil
}

// RecentBlocks returns the stored block hashes of network at or below
// height, newest first.
func (s *Store) RecentBlocks(ctx context.Context, network string, atOrBelow uint64) ([]Block, error) {
	var rows []struct {
		Number int64  `db:"block_number"`
		Hash   string `db:"block_hash"`
	}
	if err := s.db.SelectContext(ctx, &rows, `SELECT block_number, block_hash FROM chain_blocks
		WHERE network = $1 AND block_number <= $2 ORDER BY block_number DESC`, network, int64(atOrBelow)); err != nil {
		return nil, fmt.Errorf("read recent blocks of %s: %w", network, err)
	}
	out := make([]Block, len(rows))
	for i, r := range rows {
		out[i] = Block{Number: uint64(r.Number), Hash: r.Hash}
	}
	return out, nil
}

// Commit is one scan step's outcome, written in one transaction.
type Commit struct {
	Network string
	// Prev is the cursor the step started from; the commit fails with
	// ErrCursorMoved if the stored cursor is no longer Prev.
	Prev *Block
	// OrphanAbove, when set, rewinds a reorg: transfers in blocks above it
	// become orphaned unless the batch sees them again.
	OrphanAbove *uint64
	Batch       *Batch
	// Cursor is the new last scanned block; nil keeps none (nothing scanned).
	Cursor *Block
	Head   Head
	// ConfirmedAtOrBelow: transfers in blocks at or below it are confirmed.
	ConfirmedAtOrBelow uint64
	// Window is how many blocks of hashes to keep below the cursor.
	Window uint64
	// First is the batch's first block, remembered as where scanning began
	// when the network has no cursor yet.
	First uint64
}

// Commit writes a scan step atomically: reorg rewind, transfers, block
// hashes, confirmations and the cursor.
//
// Transfers a look-up recorded ahead of the scanner (Record) are
// provisional: seen again in a scanned block, they become the scanner's
// own; left unseen at or below the new cursor, their block was not the
// canonical one and they are orphaned like any other.
func (s *Store) Commit(ctx context.Context, c Commit) (orphaned int, err error) {
	now := s.Now().UTC().Truncate(time.Microsecond)
	err = pg.Tx(ctx, s.db, func(tx *sqlx.Tx) error {
		var cur cursorRow
		err := tx.GetContext(ctx, &cur, `SELECT block_number, block_hash, head, halted, first_block FROM chain_cursors
			WHERE network = $1 FOR UPDATE`, c.Network)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			cur = cursorRow{} // sqlx may have allocated the pointer fields
			if _, err := tx.ExecContext(ctx, `INSERT INTO chain_cursors (network, updated_at) VALUES ($1, $2)`, c.Network, now); err != nil {
				return fmt.Errorf("create cursor of %s: %w", c.Network, err)
			}
		case err != nil:
			return fmt.Errorf("lock cursor of %s: %w", c.Network, err)
		}
		if !sameBlock(cur, c.Prev) {
			return ErrCursorMoved
		}
		if cur.Halted {
			// Only an operator's rescan, which moves the cursor, resumes it.
			return fmt.Errorf("%w: the scanner of %s is halted", ErrReorgTooDeep, c.Network)
		}
		// Orders created before anything of this network was recorded (no
		// head, no cursor) are bounded by where scanning began; their
		// earliest_block_time bounds them too. The first commit gives that
		// height. An order whose creation raced with a commit (it read no
		// cursor, and committed after that commit's update looked) gets
		// what it would have read a moment later: the greater of the head
		// and the cursor as this commit finds them, so that no block mined
		// before it existed can pay it. The partial index on orders without
		// a height makes this a probe. (Orders are locked before transfers,
		// and by id, here as everywhere.)
		if c.Batch != nil {
			height := int64(c.First) - 1
			if cur.Number != nil {
				height = *cur.Number
			}
			if cur.Head != nil && *cur.Head > height && cur.Number != nil {
				height = *cur.Head
			}
			if _, err := tx.ExecContext(ctx, `UPDATE orders SET created_height = $2 WHERE id IN (
					SELECT id FROM orders WHERE network = $1 AND created_height IS NULL ORDER BY id FOR NO KEY UPDATE)
				AND created_height IS NULL`,
				c.Network, height); err != nil {
				return fmt.Errorf("note the height of new orders: %w", err)
			}
		}
		// The transfers this commit orphans (a batch that sees one again
		// takes it back).
		var orphans []string
		if c.OrphanAbove != nil {
			if err := tx.SelectContext(ctx, &orphans, `UPDATE transfers SET state = 'orphaned', orphaned_at = $3, updated_at = $3, ledger_dirty = true
				WHERE network = $1 AND block_number > $2 AND state <> 'orphaned' RETURNING id`, c.Network, int64(*c.OrphanAbove), now); err != nil {
				return fmt.Errorf("orphan transfers: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM chain_blocks WHERE network = $1 AND block_number > $2`, c.Network, int64(*c.OrphanAbove)); err != nil {
				return fmt.Errorf("forget orphaned blocks: %w", err)
			}
		}
		if c.Batch != nil {
			if err := upsertTransfers(ctx, tx, c.Network, c.Batch.Transfers, now, c.ConfirmedAtOrBelow); err != nil {
				return err
			}
		}
		var confirm *int64 // none: block_number <= NULL holds for no transfer
		if c.ConfirmedAtOrBelow > 0 {
			h := int64(c.ConfirmedAtOrBelow)
			confirm = &h
		}
		var first *int64
		if c.Batch != nil {
			f := int64(c.First)
			first = &f
		}
		// One round trip past the transfers: the look-ups the scanner
		// passed without seeing are orphaned, the block hashes kept (the
		// batch's and the cursor's, those fallen out of the window pruned),
		// the transfers deep enough confirmed, and the cursor moved (a
		// commit that scanned nothing has none, and leaves it so).
		var blocks []Block
		if c.Batch != nil {
			blocks = c.Batch.Blocks
		}
		var number *int64
		var hash *string
		var numbers []int64
		var hashes []string
		var below *int64
		if c.Cursor != nil {
			n := int64(c.Cursor.Number)
			number, hash = &n, &c.Cursor.Hash
			if numbers, hashes, below, err = windowBlocks(blocks, *c.Cursor, c.Window); err != nil {
				return err
			}
		} else {
			for _, b := range blocks {
				numbers, hashes = append(numbers, int64(b.Number)), append(hashes, b.Hash)
			}
		}
		var lookups pq.StringArray
		var notified []byte // void
		if err := tx.QueryRowContext(ctx, advance, c.Network, confirm, now, number, hash,
			int64(c.Head.Number), int64(c.Head.Finalized), first, confirmedHeight(c), pg.NotifyChannel,
			pq.Array(numbers), pq.Array(hashes), below).Scan(&lookups, &notified); err != nil {
			return fmt.Errorf("confirm transfers, keep block hashes, advance cursor of %s: %w", c.Network, err)
		}
		orphans = append(orphans, lookups...)
		if len(orphans) > 0 {
			// The dossiers of matched transfers the reorg took away say so on
			// their timelines (the reconciler moves their status and ledger).
			if err := tx.GetContext(ctx, &orphaned, `WITH gone AS (
					SELECT id, order_id, tx_hash, block_number, block_hash FROM transfers
					WHERE id = ANY($1) AND orphaned_at = $2
				), ev AS (
					INSERT INTO order_events (order_id, at, type, actor, detail)
					SELECT order_id, $2, 'transfer_orphaned', 'scanner',
						jsonb_build_object('transfer_id', id, 'tx_hash', tx_hash, 'block_number', block_number, 'block_hash', block_hash)
					FROM gone WHERE order_id IS NOT NULL
				)
				SELECT count(*) FROM gone`, pq.Array(orphans), now); err != nil {
				return fmt.Errorf("note orphaned transfers on timelines: %w", err)
			}
		}
		if c.OrphanAbove != nil {
			old := int64(-1)
			if c.Prev != nil {
				old = int64(c.Prev.Number)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO chain_reorgs (network, at, fork_block, old_cursor, orphaned_count)
				VALUES ($1, $2, $3, $4, $5)`, c.Network, now, int64(*c.OrphanAbove), old, orphaned); err != nil {
				return fmt.Errorf("record reorg: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrCursorMoved) {
			return 0, err
		}
		return 0, fmt.Errorf("commit scan of %s: %w", c.Network, err)
	}
	return orphaned, nil
}

// orphanLookupsAt orphans network $1's look-ups ($3 the time) that the
// scanner passed (at or below the block that the parameter named by height
// holds) without seeing: their block was not the canonical one. Its
// conditions are those of transfers_live_lookups_idx, which holds the live
// look-ups only (those orphaned before are not read).
func orphanLookupsAt(height string) string {
	return `UPDATE transfers SET state = 'orphaned', orphaned_at = $3, updated_at = $3, ledger_dirty = true
	WHERE network = $1 AND provisional AND block_number <= ` + height + ` AND state <> 'orphaned' RETURNING id`
}

// confirmTransfers confirms network $1's transfers at or below block $2
// that wait for nothing else: not a look-up's, not waiting for a balance
// check's verdict. Its conditions are those of transfers_confirmable_idx,
// which holds just these (the transfers waiting for a verdict are not read).
const confirmTransfers = `UPDATE transfers SET state = 'confirmed', updated_at = $3
	WHERE network = $1 AND state = 'seen' AND NOT provisional AND block_number <= $2
		AND NOT ('` + FlagBalancePending + `' = ANY (flags))`

// advance is a commit's step past its transfers, in one statement (one
// round trip of a catch-up's batch): orphanLookupsAt the new cursor ($4:
// its height, NULL for none; $1 network, $3 time), the block hashes kept
// (heights $11, hashes $12) and those below $13 (NULL for none) pruned,
// confirmTransfers (height $2, NULL for none), the cursor set ($4 block, $5
// hash, $6 head, $7 finalized, $8 the first block, $9 the confirmed
// height), and the network's name notified on channel $10. Its one row
// holds the ids of the look-ups orphaned, as an array, and pg_notify's
// void. The data-modifying parts touch different rows (look-ups are
// provisional and the transfers confirmed are not; windowBlocks leaves out
// what the prune removes), so that doing them together leaves what doing
// them one after another would.
var advance = `WITH lookups AS (` + orphanLookupsAt("$4") + `), kept AS (
		INSERT INTO chain_blocks (network, block_number, block_hash)
		SELECT $1, n, h FROM unnest($11::bigint[], $12::text[]) AS u(n, h)
		ON CONFLICT (network, block_number) DO UPDATE SET block_hash = EXCLUDED.block_hash
	), pruned AS (
		DELETE FROM chain_blocks WHERE network = $1 AND block_number < $13
	), confirmed AS (` + confirmTransfers + `), moved AS (
		UPDATE chain_cursors SET block_number = $4, block_hash = $5, head = $6, finalized = $7, last_error = NULL,
			updated_at = $3, first_block = COALESCE(first_block, $8), confirmed_height = $9
		WHERE network = $1
	)
	SELECT ARRAY(SELECT id FROM lookups), pg_notify($10, $1)`

// windowBlocks returns the heights and hashes of a batch's blocks and the
// cursor's to keep (the cursor's hash standing for its height), leaving
// out those below the window, and the height below which kept hashes are
// pruned (nil for none). A batch giving two hashes for one height is
// refused.
func windowBlocks(blocks []Block, cursor Block, window uint64) ([]int64, []string, *int64, error) {
	var below *int64
	if window > 0 && cursor.Number > window {
		b := int64(cursor.Number - window)
		below = &b
	}
	given := make(map[uint64]string, len(blocks)+1)
	var order []uint64
	for i, b := range append(slices.Clip(blocks), cursor) {
		if h, ok := given[b.Number]; ok {
			if h != b.Hash && i < len(blocks) {
				return nil, nil, nil, fmt.Errorf("store block hashes: two hashes for block %d (%s, %s)", b.Number, h, b.Hash)
			}
		} else {
			order = append(order, b.Number)
		}
		given[b.Number] = b.Hash
	}
	var numbers []int64
	var hashes []string
	for _, n := range order {
		if below == nil || int64(n) >= *below {
			numbers, hashes = append(numbers, int64(n)), append(hashes, given[n])
		}
	}
	return numbers, hashes, below, nil
}

// confirmedHeight is the highest block a commit confirms, bounded by its
// cursor (a block not scanned yet holds nothing recorded to confirm, and a
// verdict must not confirm a look-up's transfer above it); nil for none.
func confirmedHeight(c Commit) *int64 {
	if c.ConfirmedAtOrBelow == 0 || c.Cursor == nil {
		return nil
	}
	h := int64(min(c.ConfirmedAtOrBelow, c.Cursor.Number))
	return &h
}

func sameBlock(cur cursorRow, prev *Block) bool {
	if cur.Number == nil || cur.Hash == nil {
		return prev == nil
	}
	return prev != nil && uint64(*cur.Number) == prev.Number && *cur.Hash == prev.Hash
}

// upsertTransfers stores what the scanner found: a transfer already
// recorded moves to the block it was found in now (a reorg that mined it
// again) and stops being provisional.
// A transfer at or below confirmedAtOrBelow (0: none) that waits for no verdict is
// stored confirmed at once (a catch-up writes each row once).
func upsertTransfers(ctx context.Context, tx *sqlx.Tx, network string, found []Found, now time.Time, confirmedAtOrBelow uint64) error {
	return insertTransfers(ctx, tx, network, found, now, false, confirmedAtOrBelow)
}

// insertTransfers stores transfers: as the scanner's (upserting) or, when
// provisional, as a look-up's (leaving any already recorded untouched, and
// confirming nothing).
func insertTransfers(ctx context.Context, tx *sqlx.Tx, network string, found []Found, now time.Time, provisional bool, confirmedAtOrBelow uint64) error {
	if len(found) == 0 {
		return nil
	}
	n := len(found)
	ids, assets, contracts, hashes, keys := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	idx, froms, tos, amounts := make([]int64, n), make([]string, n), make([]string, n), make([]string, n)
	numbers, blockHashes, flags, states := make([]int64, n), make([]string, n), make([]string, n), make([]string, n)
	times := make([]*time.Time, n)
	made := time.Now()
	for i, f := range found {
		ids[i] = paywatch.NewSortableID("trf", made)
		assets[i], contracts[i] = f.Asset.Symbol, f.Asset.Contract
		hashes[i], keys[i], idx[i] = f.TxHash, f.TxKey, f.Index
		froms[i], tos[i], amounts[i] = f.From, f.To, f.Amount.String()
		numbers[i], blockHashes[i] = int64(f.BlockNumber), f.BlockHash
		flags[i] = strings.Join(f.Flags, ",")
		states[i] = string(paywatch.TransferSeen)
		if !provisional && confirmedAtOrBelow > 0 && f.BlockNumber <= confirmedAtOrBelow && !slices.Contains(f.Flags, FlagBalancePending) {
			states[i] = string(paywatch.TransferConfirmed)
		}
		if !f.BlockTime.IsZero() {
			bt := f.BlockTime.UTC()
			times[i] = &bt
		}
	}
	blockTimes := make([]string, n) // text, so that NULLs travel in one array
	for i, t := range times {
		if t != nil {
			blockTimes[i] = t.Format(time.RFC3339Nano)
		}
	}
	conflict := `DO NOTHING`
	if !provisional {
		conflict = scannerConflict
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO transfers (id, network, asset, asset_contract, tx_hash, tx_key, idx,
			from_address, to_address, amount, block_number, block_hash, block_time, state, flags, first_seen_at, updated_at, provisional)
		SELECT u.id, $1, u.asset, u.contract, u.hash, u.key, u.idx, u.from_addr, u.to_addr, u.amount::numeric,
			u.number, u.block_hash, NULLIF(u.block_time, '')::timestamptz, u.state, string_to_array(u.flags, ','), $2, $2, $16
		FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::text[],
			$10::text[], $11::text[], $12::bigint[], $13::text[], $14::text[], $15::text[], $17::text[])
			AS u(id, asset, contract, hash, key, idx, from_addr, to_addr, amount, number, block_hash, flags, block_time, state)
		ON CONFLICT (network, tx_hash, tx_key) `+conflict,
		network, now, pq.Array(ids), pq.Array(assets), pq.Array(contracts), pq.Array(hashes), pq.Array(keys),
		pq.Array(idx), pq.Array(froms), pq.Array(tos), pq.Array(amounts), pq.Array(numbers), pq.Array(blockHashes), pq.Array(flags), pq.Array(blockTimes),
		provisional, pq.Array(states))
	if err != nil {
		return fmt.Errorf("store %d transfers: %w", n, err)
	}
	return nil
}

// scannerConflict is what the scanner does with a transfer it finds again:
// what it sees now is the truth, whatever was recorded before (a look-up's
// provisional record, or the block the transaction was mined in before a
// reorg). When anything changed, the transfer is marked ledger_dirty: the
// reconciler checks its match again and the ledger reposts it. The same
// transfer found again in the same block (a rescan) keeps its flags: a
// balance check's verdict is the block's, so it stands and the transfer
// waits for no new one (a look-up's record had no verdict to keep). The
// flags that record a decision about the money rather than what the chain
// shows (held, ambiguous) stay wherever it is mined again: only an
// operator's attach places such a transfer.
const scannerConflict = `DO UPDATE SET
			idx = EXCLUDED.idx, block_number = EXCLUDED.block_number, block_hash = EXCLUDED.block_hash,
			block_time = EXCLUDED.block_time, asset = EXCLUDED.asset, asset_contract = EXCLUDED.asset_contract,
			from_address = EXCLUDED.from_address, to_address = EXCLUDED.to_address, amount = EXCLUDED.amount,
			flags = CASE WHEN transfers.block_hash = EXCLUDED.block_hash AND NOT transfers.provisional
				THEN transfers.flags
				ELSE EXCLUDED.flags || ARRAY(SELECT f FROM unnest(transfers.flags) AS f
					WHERE f IN ('` + paywatch.FlagHeld + `', '` + paywatch.FlagAmbiguous + `') AND NOT f = ANY (EXCLUDED.flags))
				END,
			state = CASE WHEN transfers.state <> 'orphaned' AND transfers.block_hash = EXCLUDED.block_hash
				THEN transfers.state
				WHEN transfers.block_hash = EXCLUDED.block_hash AND NOT transfers.provisional
					AND '` + FlagBalancePending + `' = ANY (transfers.flags) THEN 'seen'
				ELSE EXCLUDED.state END,
			ledger_dirty = transfers.ledger_dirty OR (transfers.block_hash, transfers.asset, transfers.asset_contract,
				transfers.to_address, transfers.amount, transfers.flags) IS DISTINCT FROM (EXCLUDED.block_hash,
				EXCLUDED.asset, EXCLUDED.asset_contract, EXCLUDED.to_address, EXCLUDED.amount, EXCLUDED.flags),
			orphaned_at = NULL, provisional = false,
			updated_at = CASE WHEN transfers.block_hash = EXCLUDED.block_hash AND transfers.state <> 'orphaned'
				THEN transfers.updated_at ELSE EXCLUDED.updated_at END`

func storeBlocks(ctx context.Context, tx *sqlx.Tx, network string, blocks []Block) error {
	if len(blocks) == 0 {
		return nil
	}
	numbers, hashes := make([]int64, len(blocks)), make([]string, len(blocks))
	for i, b := range blocks {
		numbers[i], hashes[i] = int64(b.Number), b.Hash
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO chain_blocks (network, block_number, block_hash)
		SELECT $1, n, h FROM unnest($2::bigint[], $3::text[]) AS u(n, h)
		ON CONFLICT (network, block_number) DO UPDATE SET block_hash = EXCLUDED.block_hash`,
		network, pq.Array(numbers), pq.Array(hashes))
	if err != nil {
		return fmt.Errorf("store block hashes: %w", err)
	}
	return nil
}

// RecordStatus notes a head and an error (or its clearing) for network
// without moving the cursor; halted stops the scanner until an operator
// clears it.
func (s *Store) RecordStatus(ctx context.Context, network string, head *Head, lastError string, halted bool) error {
	var h, f *int64
	if head != nil {
		hn, fn := int64(head.Number), int64(head.Finalized)
		h, f = &hn, &fn
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO chain_cursors (network, head, finalized, last_error, halted, updated_at)
		VALUES ($1, $2, $3, NULLIF($4, ''), $5, $6)
		ON CONFLICT (network) DO UPDATE SET head = COALESCE(EXCLUDED.head, chain_cursors.head),
			finalized = COALESCE(EXCLUDED.finalized, chain_cursors.finalized),
			last_error = EXCLUDED.last_error, halted = chain_cursors.halted OR EXCLUDED.halted,
			updated_at = EXCLUDED.updated_at`,
		network, h, f, lastError, halted, s.Now().UTC())
	if err != nil {
		return fmt.Errorf("record status of %s: %w", network, err)
	}
	return nil
}

// Status is what a network's scanner last recorded.
type Status struct {
	Network    string    `db:"network"`
	Cursor     *int64    `db:"block_number"`
	CursorHash *string   `db:"block_hash"`
	Head       *int64    `db:"head"`
	LastError  *string   `db:"last_error"`
	Halted     bool      `db:"halted"`
	UpdatedAt  time.Time `db:"updated_at"`
}

// Ping checks that the database answers (on another connection if the
// first one it tried had died: pg.Read).
func (s *Store) Ping(ctx context.Context) error {
	return pg.Read(ctx, s.db, func() error { return s.db.PingContext(ctx) })
}

// Statuses returns the scanners' state by network name.
func (s *Store) Statuses(ctx context.Context) (map[string]Status, error) {
	var rows []Status
	if err := pg.Read(ctx, s.db, func() error {
		rows = nil
		return s.db.SelectContext(ctx, &rows, `SELECT network, block_number, block_hash, head, last_error, halted, updated_at
			FROM chain_cursors`)
	}); err != nil {
		return nil, fmt.Errorf("read chain cursors: %w", err)
	}
	out := make(map[string]Status, len(rows))
	for _, r := range rows {
		out[r.Network] = r
	}
	return out, nil
}

// Record stores transfers found outside a scan (a customer's tx hash
// looked up on the node) without moving the cursor. They are provisional
// (see Commit): they may be matched at once, but confirm only once the
// scanner has seen them in a canonical block. A transfer already recorded
// is left as it is, and one at or below the cursor is not recorded: the
// scanner has passed its block without seeing it there.
func (s *Store) Record(ctx context.Context, network string, found []Found) error {
	now := s.Now().UTC().Truncate(time.Microsecond)
	return pg.Tx(ctx, s.db, func(tx *sqlx.Tx) error {
		var at struct {
			Cursor *int64 `db:"block_number"`
			Head   *int64 `db:"head"`
		}
		err := tx.GetContext(ctx, &at, `SELECT block_number, head FROM chain_cursors WHERE network = $1 FOR SHARE`, network)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("read cursor of %s: %w", network, err)
		}
		var ahead []Found
		for _, f := range found {
			switch {
			case at.Cursor != nil && f.BlockNumber <= uint64(*at.Cursor):
				// The scanner passed this block without seeing it there.
			case at.Head != nil && f.BlockNumber > uint64(*at.Head)+MaxLookupLead:
				s.warn("a node look-up answered from far beyond the head; ignored", "network", network,
					"tx_hash", f.TxHash, "block", f.BlockNumber, "head", *at.Head)
			default:
				ahead = append(ahead, f)
			}
		}
		return insertTransfers(ctx, tx, network, ahead, now, true, 0)
	})
}

// MaxLookupLead is how far beyond the recorded head a look-up's block may
// be: a node that answers from further ahead is lying or on another chain,
// and one such answer must not push the height new orders are created at.
const MaxLookupLead = 1000

// Rewind moves a network's cursor back to block to (an operator's decision
// after a reorg too deep to walk back): transfers above it become orphaned
// until the rescan sees them again, the kept hashes above it are dropped,
// and the halt is cleared — in one transaction.
func (s *Store) Rewind(ctx context.Context, network string, to Block) (orphaned int, err error) {
	now := s.Now().UTC().Truncate(time.Microsecond)
	err = pg.Tx(ctx, s.db, func(tx *sqlx.Tx) error {
		var old *int64
		err := tx.GetContext(ctx, &old, `SELECT block_number FROM chain_cursors WHERE network = $1 FOR UPDATE`, network)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("network %s has never been scanned", network)
		}
		if err != nil {
			return fmt.Errorf("lock cursor of %s: %w", network, err)
		}
		res, err := tx.ExecContext(ctx, `UPDATE transfers SET state = 'orphaned', orphaned_at = $3, updated_at = $3, ledger_dirty = true
			WHERE network = $1 AND block_number > $2 AND state <> 'orphaned'`, network, int64(to.Number), now)
		if err != nil {
			return fmt.Errorf("orphan transfers: %w", err)
		}
		n, _ := res.RowsAffected()
		orphaned = int(n)
		if _, err := tx.ExecContext(ctx, `INSERT INTO order_events (order_id, at, type, actor, detail)
			SELECT order_id, $2, 'transfer_orphaned', 'operator', jsonb_build_object('transfer_id', id, 'tx_hash', tx_hash,
				'block_number', block_number, 'reason', 'rescan')
			FROM transfers WHERE network = $1 AND orphaned_at = $2 AND order_id IS NOT NULL`, network, now); err != nil {
			return fmt.Errorf("note orphaned transfers on timelines: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM chain_blocks WHERE network = $1 AND block_number > $2`, network, int64(to.Number)); err != nil {
			return fmt.Errorf("forget block hashes: %w", err)
		}
		if err := storeBlocks(ctx, tx, network, []Block{to}); err != nil {
			return err
		}
		oldCursor := int64(-1)
		if old != nil {
			oldCursor = *old
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO chain_reorgs (network, at, fork_block, old_cursor, orphaned_count)
			VALUES ($1, $2, $3, $4, $5)`, network, now, int64(to.Number), oldCursor, n); err != nil {
			return fmt.Errorf("record rewind: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE chain_cursors SET block_number = $2, block_hash = $3, halted = false,
			last_error = NULL, updated_at = $4, confirmed_height = CASE WHEN confirmed_height IS NOT NULL THEN least(confirmed_height, $2) END WHERE network = $1`,
			network, int64(to.Number), to.Hash, now); err != nil {
			return fmt.Errorf("rewind cursor: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return orphaned, nil
}

// Unverified returns up to limit of network's transfers waiting for their
// source's verdict (FlagBalancePending), lowest blocks first, after the
// given position (block number and id; zero for the start): a round pages
// past those it could not decide.
func (s *Store) Unverified(ctx context.Context, network string, afterBlock uint64, afterID string, limit int) ([]Unverified, error) {
	var rows []struct {
		ID       string `db:"id"`
		Contract string `db:"asset_contract"`
		To       string `db:"to_address"`
		Number   int64  `db:"block_number"`
		Hash     string `db:"block_hash"`
	}
	if err := s.db.SelectContext(ctx, &rows, `SELECT id, asset_contract, to_address, block_number, block_hash
		FROM transfers
		WHERE network = $1 AND state = 'seen' AND '`+FlagBalancePending+`' = ANY (flags) AND (block_number, id) > ($2, $3)
		ORDER BY block_number, id LIMIT $4`, network, int64(afterBlock), afterID, limit); err != nil {
		return nil, fmt.Errorf("read unverified transfers of %s: %w", network, err)
	}
	out := make([]Unverified, len(rows))
	for i, r := range rows {
		out[i] = Unverified{ID: r.ID, Contract: r.Contract, To: r.To, BlockNumber: uint64(r.Number), BlockHash: r.Hash}
	}
	return out, nil
}

// RecordVerdicts writes a Verifier's verdicts in one transaction. Each
// transfer still pending in the block it was verified in loses
// FlagBalancePending and gains the verdict's flag; one whose block is
// confirmed confirms now. A matched transfer that earned a flag is marked
// ledger_dirty, so that the reconciler checks its match again. The
// reconciler is told. It returns how many transfers the verdicts changed.
func (s *Store) RecordVerdicts(ctx context.Context, network string, verdicts []Verdict) (int, error) {
	if len(verdicts) == 0 {
		return 0, nil
	}
	now := s.Now().UTC().Truncate(time.Microsecond)
	ids, hashes, flags := make([]string, len(verdicts)), make([]string, len(verdicts)), make([]string, len(verdicts))
	for i, v := range verdicts {
		ids[i], hashes[i], flags[i] = v.ID, v.BlockHash, v.Flag
	}
	var n int
	err := pg.Tx(ctx, s.db, func(tx *sqlx.Tx) error {
		// The cursor row first, as a commit locks it: the confirmed height
		// read is the one no commit is changing.
		var confirmed *int64
		err := tx.GetContext(ctx, &confirmed, `SELECT confirmed_height FROM chain_cursors WHERE network = $1 FOR SHARE`, network)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("read confirmed height of %s: %w", network, err)
		}
		// Transfers are locked in id order, as the ledger locks them: a
		// verdict and a reconciler pass never wait for each other in a
		// circle.
		if _, err := tx.ExecContext(ctx, `SELECT 1 FROM transfers WHERE id = ANY($1) ORDER BY id FOR UPDATE`, pq.Array(ids)); err != nil {
			return fmt.Errorf("lock verified transfers: %w", err)
		}
		err = tx.GetContext(ctx, &n, `WITH v AS (
				SELECT * FROM unnest($2::text[], $3::text[], $4::text[]) AS v(id, block_hash, flag)
			), done AS (
				UPDATE transfers t SET
					flags = array_remove(t.flags, '`+FlagBalancePending+`') || CASE WHEN v.flag = '' THEN '{}'::text[] ELSE ARRAY[v.flag] END,
					state = CASE WHEN NOT t.provisional AND t.block_number <= $5 THEN 'confirmed' ELSE t.state END,
					ledger_dirty = t.ledger_dirty OR (t.order_id IS NOT NULL AND v.flag <> ''),
					updated_at = $6
				FROM v
				WHERE t.id = v.id AND t.network = $1 AND t.block_hash = v.block_hash AND t.state = 'seen'
					AND '`+FlagBalancePending+`' = ANY (t.flags)
				RETURNING t.id
			)
			SELECT count(*) FROM done`, network, pq.Array(ids), pq.Array(hashes), pq.Array(flags), confirmed, now)
		if err != nil {
			return fmt.Errorf("record verdicts: %w", err)
		}
		if n > 0 {
			if _, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, pg.NotifyChannel, network); err != nil {
				return fmt.Errorf("notify: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}
