package scan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/paywatch/paywatch"
)

// Defaults of a Scanner's tuning.
const (
	DefaultMaxBatch    = 2000
	DefaultMinWindow   = 128
	DefaultRetryMin    = 500 * time.Millisecond
	DefaultRetryMax    = 30 * time.Second
	growAfterSuccesses = 3
)

// Scanner watches one network through a Source.
type Scanner struct {
	Network *paywatch.Network
	Source  Source
	Store   *Store
	Log     *slog.Logger
	// MaxBatch is the largest range scanned at once; the scanner halves it
	// when the node refuses a range and grows it back after successes.
	MaxBatch uint64
	// Window is how many blocks of hashes are kept for reorg detection.
	Window   uint64
	RetryMin time.Duration
	RetryMax time.Duration

	batch     uint64
	successes int
}

// NewScanner returns a Scanner with default tuning.
func NewScanner(n *paywatch.Network, src Source, store *Store, log *slog.Logger) *Scanner {
	window := uint64(DefaultMinWindow)
	if w := uint64(2*n.Confirmations + 2); w > window {
		window = w
	}
	return &Scanner{Network: n, Source: src, Store: store, Log: log.With("network", n.Name),
		MaxBatch: DefaultMaxBatch, Window: window, RetryMin: DefaultRetryMin, RetryMax: DefaultRetryMax}
}

// Run scans until ctx ends. Errors are recorded on the network's status and
// retried with capped exponential backoff; a reorg deeper than the window
// halts the scanner and is returned.
func (s *Scanner) Run(ctx context.Context) error {
	failures := 0
	for {
		caughtUp, err := s.Step(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var wait time.Duration
		switch {
		case errors.Is(err, ErrReorgTooDeep):
			s.Log.Error("scanner halted: reorg deeper than the kept window; an operator must check the chain", "err", err)
			_ = s.Store.RecordStatus(context.WithoutCancel(ctx), s.Network.Name, nil, err.Error(), true)
			return err
		case err != nil:
			failures++
			wait = backoff(s.RetryMin, s.RetryMax, failures)
			s.Log.Warn("scan step failed", "err", err, "retry_in", wait.Round(time.Millisecond))
			if rerr := s.Store.RecordStatus(ctx, s.Network.Name, nil, err.Error(), false); rerr != nil {
				s.Log.Warn("could not record scanner status", "err", rerr)
			}
		case caughtUp:
			failures = 0
			wait = s.Network.PollInterval
		default:
			failures = 0
		}
		if wait > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		}
	}
}

// backoff is min·2^(n-1), capped at max, with up to 50% jitter below.
func backoff(min, max time.Duration, n int) time.Duration {
	d := min
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// Step scans at most one batch. It reports whether the scanner has reached
// the head.
func (s *Scanner) Step(ctx context.Context) (caughtUp bool, err error) {
	if s.batch == 0 {
		s.batch = max(s.MaxBatch, 1)
	}
	head, err := s.Source.Head(ctx)
	if err != nil {
		return false, fmt.Errorf("read head: %w", err)
	}
	cur, halted, err := s.Store.Cursor(ctx, s.Network.Name)
	if err != nil {
		return false, err
	}
	if halted {
		return false, ErrReorgTooDeep
	}

	var from uint64
	var orphanAbove *uint64
	switch {
	case cur == nil && s.Network.StartLatest:
		from = head.Number
	case cur == nil:
		from = s.Network.StartBlock
	case cur.Number > head.Number:
		// The node is behind what we scanned (a lagging fallback node, or a
		// reorg to a shorter chain that the next step will see).
		return true, s.Store.RecordStatus(ctx, s.Network.Name, &head, "", false)
	default:
		hash, err := s.Source.BlockHash(ctx, cur.Number)
		if err != nil {
			return false, fmt.Errorf("check cursor block %d: %w", cur.Number, err)
		}
		from = cur.Number + 1
		if hash != cur.Hash {
			above, err := s.forkPoint(ctx, cur)
			if err != nil {
				return false, err
			}
			orphanAbove, from = &above, above+1
			s.Log.Warn("reorg detected", "cursor", cur.Number, "fork_below", above+1)
		}
	}

	commit := Commit{Network: s.Network.Name, Prev: cur, OrphanAbove: orphanAbove, Cursor: cur,
		Head: head, ConfirmedAtOrBelow: s.confirmedAtOrBelow(head), Window: s.Window}
	if orphanAbove != nil {
		commit.Cursor = nil
	}
	to := head.Number
	if from <= to {
		to = min(to, from+s.batch-1)
		batch, err := s.Source.Scan(ctx, from, to)
		if errors.Is(err, ErrRangeTooLarge) && to > from {
			s.batch = max((to-from+1)/2, 1)
			s.successes = 0
			s.Log.Info("node refused the range; halving", "blocks", to-from+1, "now", s.batch)
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("scan blocks %d-%d: %w", from, to, err)
		}
		if cur == nil && from > 0 {
			// Anchor the first batch to its parent, so that a reorg reaching
			// below the first scanned block is seen and rescanned.
			batch.Blocks = append(batch.Blocks, Block{Number: from - 1})
		}
		last, err := s.verify(ctx, batch, from, to, head)
		if err != nil {
			return false, err
		}
		commit.Batch, commit.Cursor = batch, &last
	} else if orphanAbove != nil {
		// The new chain is not longer than the fork point yet.
		last, err := s.Source.BlockHash(ctx, *orphanAbove)
		if err != nil {
			return false, err
		}
		commit.Cursor = &Block{Number: *orphanAbove, Hash: last}
	}

	orphaned, err := s.Store.Commit(ctx, commit)
	if err != nil {
		return false, err
	}
	if orphanAbove != nil {
		s.Log.Warn("reorg handled", "fork_below", *orphanAbove+1, "orphaned_transfers", orphaned)
	}
	if commit.Batch != nil {
		s.successes++
		if s.successes >= growAfterSuccesses && s.batch < s.MaxBatch {
			s.batch = min(s.batch*2, s.MaxBatch)
			s.successes = 0
		}
		if n := len(commit.Batch.Transfers); n > 0 {
			s.Log.Info("transfers found", "from", from, "to", commit.Cursor.Number, "count", n)
		}
	}
	return commit.Cursor != nil && commit.Cursor.Number >= head.Number, nil
}

// confirmedAtOrBelow is the highest block whose transfers are confirmed.
func (s *Scanner) confirmedAtOrBelow(h Head) uint64 {
	if s.Network.UseFinalized {
		return h.Finalized
	}
	c := uint64(max(s.Network.Confirmations, 1))
	if h.Number+1 < c {
		return 0
	}
	return h.Number + 1 - c
}

// verify checks that every block of the batch that holds a transfer, and
// its last block, are still canonical. It also fills in the hash of every
// scanned block within a window of the head, so that a later reorg can be
// walked back block by block. It returns the batch's last block.
func (s *Scanner) verify(ctx context.Context, b *Batch, from, to uint64, head Head) (Block, error) {
	reported := map[uint64]string{}
	for _, blk := range b.Blocks {
		reported[blk.Number] = blk.Hash
	}
	for _, t := range b.Transfers {
		if h, ok := reported[t.BlockNumber]; ok && h != "" && h != t.BlockHash {
			return Block{}, inconsistentError{t.BlockNumber}
		}
		reported[t.BlockNumber] = t.BlockHash
	}
	if _, ok := reported[to]; !ok {
		reported[to] = ""
	}
	recent := from
	if head.Number >= s.Window && head.Number-s.Window+1 > recent {
		recent = head.Number - s.Window + 1
	}
	for n := recent; n <= to; n++ {
		if _, ok := reported[n]; !ok {
			reported[n] = ""
		}
	}
	numbers := make([]uint64, 0, len(reported))
	for n := range reported {
		numbers = append(numbers, n)
	}
	slices.Sort(numbers)
	canonical, err := blockHashes(ctx, s.Source, numbers)
	if err != nil {
		return Block{}, fmt.Errorf("check batch blocks: %w", err)
	}
	b.Blocks = b.Blocks[:0]
	for i, n := range numbers {
		if canonical[i] == "" || (reported[n] != "" && canonical[i] != reported[n]) {
			return Block{}, inconsistentError{n}
		}
		b.Blocks = append(b.Blocks, Block{Number: n, Hash: canonical[i]})
	}
	return b.Blocks[len(b.Blocks)-1], nil
}

// forkPoint walks the stored hashes down from the cursor to the highest
// block still on the canonical chain and returns its height: everything
// above it is to be rescanned.
func (s *Scanner) forkPoint(ctx context.Context, cur *Block) (uint64, error) {
	stored, err := s.Store.RecentBlocks(ctx, s.Network.Name, cur.Number)
	if err != nil {
		return 0, err
	}
	if len(stored) == 0 {
		return 0, fmt.Errorf("%w: no block hashes kept below %d", ErrReorgTooDeep, cur.Number)
	}
	numbers := make([]uint64, len(stored))
	for i, b := range stored {
		numbers[i] = b.Number
	}
	canonical, err := blockHashes(ctx, s.Source, numbers)
	if err != nil {
		return 0, fmt.Errorf("walk back to the fork: %w", err)
	}
	for i, b := range stored {
		if canonical[i] == b.Hash {
			return b.Number, nil
		}
	}
	lowest := stored[len(stored)-1].Number
	if cur.Number >= s.Window && lowest <= cur.Number-s.Window {
		return 0, fmt.Errorf("%w (%d blocks below %d)", ErrReorgTooDeep, s.Window, cur.Number)
	}
	// Scanning began less than a window ago, below every kept hash: rescan
	// from the first block scanned.
	if lowest == 0 {
		return 0, fmt.Errorf("%w: genesis changed", ErrReorgTooDeep)
	}
	return lowest - 1, nil
}

// HashBatcher is implemented by Sources that read many block hashes in one
// round trip.
type HashBatcher interface {
	BlockHashes(ctx context.Context, numbers []uint64) ([]string, error)
}

func blockHashes(ctx context.Context, src Source, numbers []uint64) ([]string, error) {
	if hb, ok := src.(HashBatcher); ok {
		return hb.BlockHashes(ctx, numbers)
	}
	out := make([]string, len(numbers))
	for i, n := range numbers {
		h, err := src.BlockHash(ctx, n)
		if err != nil && !errors.Is(err, ErrNoBlock) {
			return nil, err
		}
		out[i] = h
	}
	return out, nil
}
