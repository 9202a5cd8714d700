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
	// Observer is told of batches and failures (metrics); may be nil.
	Observer Observer
	// ReadAhead is how many ranges are read ahead of the batch that
	// commits (DefaultReadAhead, or what a ReadAheadLimiter source asks).
	ReadAhead int

	batch     uint64
	stepStart time.Time
	progress  catchUp
	successes int
	// ahead holds the batches being read ahead while the one before
	// commits: up to ReadAhead consecutive ranges, in order.
	ahead []*prefetch
	// lastHead is the head the last commit saw.
	lastHead uint64
	// known is the cursor as this scanner's last commit left it (nil when
	// unknown): the next step starts from it instead of reading it back.
	// Each commit checks the cursor it starts from under the cursor's lock,
	// so a cursor moved meanwhile (paywatch rescan, another instance) costs
	// a step that commits nothing and is taken again at once, reading it.
	known *Block
	// verifyWake tells Run's verifier that a commit recorded transfers
	// waiting for a verdict.
	verifyWake chan struct{}
}

// VerifyBatch is how many pending transfers one Verifier call decides.
const VerifyBatch = 2000

// prefetch is a Source.Scan started ahead of time.
type prefetch struct {
	from, to uint64
	done     chan struct{}
	cancel   context.CancelFunc
	batch    *Batch
	err      error
}

// DefaultReadAhead is how many ranges a catch-up reads ahead of the batch
// it commits: with a node far away, two reads in flight hide each other's
// latency. Each is checked, when its turn comes, to continue the chain the
// cursor stands on.
const DefaultReadAhead = 2

// ReadAheadLimiter is a Source that wants fewer ranges read ahead (whose
// answers are large: Bitcoin's raw blocks).
type ReadAheadLimiter interface {
	ReadAhead() int
}

func (s *Scanner) startPrefetch(ctx context.Context, from, to, head uint64) {
	ctx, cancel := context.WithCancel(ctx)
	p := &prefetch{from: from, to: to, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(p.done)
		p.batch, p.err = s.scanRange(ctx, from, to, head)
	}()
	s.ahead = append(s.ahead, p)
}

// readAhead keeps up to s.ReadAhead consecutive ranges after block last
// being read (up to head), keeping those already under way that follow
// on.
func (s *Scanner) readAhead(ctx context.Context, last, head uint64) {
	next := last + 1
	for i := 0; i < max(s.ReadAhead, 1) && next <= head; i++ {
		if i < len(s.ahead) && s.ahead[i].from == next {
			next = s.ahead[i].to + 1
			continue
		}
		s.dropFrom(i) // out of step: read from here again
		to := min(head, next+s.batch-1)
		s.startPrefetch(ctx, next, to, head)
		next = to + 1
	}
}

// scanRange has the source scan [from, to] and, where it can in the same
// round trip, read the hashes verify checks: those of the range's blocks
// whose hashes are kept (keptFrom).
func (s *Scanner) scanRange(ctx context.Context, from, to, head uint64) (*Batch, error) {
	hs, ok := s.Source.(HashScanner)
	if !ok || head == 0 || to < s.keptFrom(head) {
		// The head is not known yet, or the range is below the kept blocks.
		return s.Source.Scan(ctx, from, to)
	}
	var heights []uint64
	for n := max(from, s.keptFrom(head)); n <= to; n++ {
		heights = append(heights, n)
	}
	return hs.ScanWithHashes(ctx, from, to, heights)
}

// keptFrom is the lowest block whose hash is kept at head: the Window
// blocks up to head and the one below them, where a reorg replacing the
// whole window forks (the store keeps as much, block by block).
func (s *Scanner) keptFrom(head uint64) uint64 {
	if head >= s.Window {
		return head - s.Window
	}
	return 0
}

// dropPrefetch forgets the batches read ahead, cancelling their reads.
func (s *Scanner) dropPrefetch() { s.dropFrom(0) }

// dropFrom forgets the batches read ahead from the i-th on, cancelling
// their reads.
func (s *Scanner) dropFrom(i int) {
	for _, p := range s.ahead[min(i, len(s.ahead)):] {
		p.cancel()
	}
	s.ahead = s.ahead[:min(i, len(s.ahead))]
}

// takePrefetch returns the first batch read ahead if it is for exactly
// from, or nil (forgetting every batch read ahead: they are out of step).
func (s *Scanner) takePrefetch(ctx context.Context, from uint64) (*prefetch, error) {
	if len(s.ahead) == 0 || s.ahead[0].from != from {
		s.dropPrefetch()
		return nil, nil
	}
	p := s.ahead[0]
	s.ahead = s.ahead[1:]
	select {
	case <-p.done:
		p.cancel() // its read is over
	case <-ctx.Done():
		p.cancel()
		return nil, ctx.Err()
	}
	return p, nil
}

// NewScanner returns a Scanner with default tuning.
func NewScanner(n *paywatch.Network, src Source, store *Store, log *slog.Logger) *Scanner {
	window := uint64(DefaultMinWindow)
	if w := uint64(2*n.Confirmations + 2); w > window {
		window = w
	}
	maxBatch := uint64(DefaultMaxBatch)
	if rl, ok := src.(RangeLimiter); ok {
		maxBatch = min(maxBatch, rl.MaxRange())
	}
	readAhead := DefaultReadAhead
	if rl, ok := src.(ReadAheadLimiter); ok {
		readAhead = min(readAhead, rl.ReadAhead())
	}
	return &Scanner{Network: n, Source: src, Store: store, Log: log.With("network", n.Name),
		MaxBatch: maxBatch, Window: window, RetryMin: DefaultRetryMin, RetryMax: DefaultRetryMax, ReadAhead: readAhead}
}

// Run scans until ctx ends. Errors are recorded on the network's status and
// retried with capped exponential backoff. A reorg deeper than the window
// halts the network until an operator rewinds it (Store.Rewind); Run waits
// for that and goes on.
func (s *Scanner) Run(ctx context.Context) error {
	if v, ok := s.Source.(Verifier); ok {
		// Verdicts come off the path that advances the cursor: the
		// scanner records, the verifier checks behind it.
		s.verifyWake = make(chan struct{}, 1)
		done := make(chan struct{})
		defer func() { <-done }()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			defer close(done)
			s.runVerifier(ctx, v)
		}()
		return s.run(ctx)
	}
	return s.run(ctx)
}

func (s *Scanner) run(ctx context.Context) error {
	// A run (a lease taken again) starts from the stored cursor.
	s.known = nil
	failures := 0
	halted := false
	for {
		caughtUp, err := s.Step(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var wait time.Duration
		switch {
		case errors.Is(err, ErrReorgTooDeep):
			// Halted until an operator rewinds the cursor (paywatch rescan):
			// say so once, then wait for it.
			if !halted {
				s.Log.Error("scanner halted: reorg deeper than the kept window; check the chain, then run paywatch rescan", "err", err)
				if rerr := s.Store.RecordStatus(ctx, s.Network.Name, nil, err.Error(), true); rerr != nil {
					s.Log.Warn("could not record the halt", "err", rerr)
					halted = false
					wait = s.RetryMin
					break
				}
			}
			halted = true
			wait = max(s.Network.PollInterval, time.Second)
		case err != nil:
			halted = false
			failures++
			if s.Observer != nil {
				s.Observer.StepFailed(s.Network.Name, ErrorKind(err))
			}
			wait = backoff(s.RetryMin, s.RetryMax, failures)
			s.Log.Warn("scan step failed", "err", err, "retry_in", wait.Round(time.Millisecond))
			if rerr := s.Store.RecordStatus(ctx, s.Network.Name, nil, err.Error(), false); rerr != nil {
				s.Log.Warn("could not record scanner status", "err", rerr)
			}
		case caughtUp:
			failures, halted = 0, false
			wait = s.Network.PollInterval
		default:
			failures, halted = 0, false
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

// runVerifier has the source verify pending transfers whenever a commit
// reached the head, and at each poll interval (a catch-up's batches, what
// an earlier run left), until ctx ends. Failures are retried with the scanner's backoff; the
// transfers wait, unconfirmed, meanwhile.
func (s *Scanner) runVerifier(ctx context.Context, v Verifier) {
	failures := 0
	for {
		wait := max(s.Network.PollInterval, 100*time.Millisecond)
		if _, err := s.verifyPending(ctx, v); err != nil && ctx.Err() == nil {
			failures++
			wait = backoff(s.RetryMin, s.RetryMax, failures)
			s.Log.Warn("verifying transfers failed; they stay unconfirmed", "err", err, "retry_in", wait.Round(time.Millisecond))
			if s.Observer != nil {
				s.Observer.StepFailed(s.Network.Name, "balance_check")
			}
		} else {
			failures = 0
		}
		wake := s.verifyWake
		if failures > 0 {
			wake = nil // a commit does not cut a backoff short
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-wake:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// VerifyPending has the Source verify every transfer recorded pending
// (FlagBalancePending), in batches, until none is left or a batch decides
// nothing. It returns how many transfers got their verdict. Run does this
// by itself; a Source that verifies nothing later returns 0.
func (s *Scanner) VerifyPending(ctx context.Context) (int, error) {
	v, ok := s.Source.(Verifier)
	if !ok {
		return 0, nil
	}
	return s.verifyPending(ctx, v)
}

func (s *Scanner) verifyPending(ctx context.Context, v Verifier) (int, error) {
	total := 0
	var afterBlock uint64
	afterID := ""
	for {
		pending, err := s.Store.Unverified(ctx, s.Network.Name, afterBlock, afterID, VerifyBatch)
		if err != nil || len(pending) == 0 {
			return total, err
		}
		verdicts, verr := v.Verify(ctx, pending)
		// What was decided before a failure is kept.
		n, err := s.Store.RecordVerdicts(ctx, s.Network.Name, verdicts)
		total += n
		if verr != nil {
			return total, fmt.Errorf("verify %d transfers: %w", len(pending), verr)
		}
		if err != nil {
			return total, err
		}
		if len(pending) < VerifyBatch {
			return total, nil
		}
		// Those left without a verdict (a block the scanner has yet to see
		// replaced, say) are tried again next round; this one goes on past
		// them.
		last := pending[len(pending)-1]
		afterBlock, afterID = last.BlockNumber, last.ID
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
	s.stepStart = time.Now()
	if s.batch == 0 {
		s.batch = max(s.MaxBatch, 1)
	}
	cur, cached := s.known, s.known != nil
	s.known = nil // until a commit of this step sets it again
	if cached {
		defer func() {
			if errors.Is(err, ErrCursorMoved) {
				// Counted as the failure it would have been, without the
				// backoff: the next step reads the cursor.
				s.Log.Info("the cursor moved since this scanner's last commit (a rescan, or another instance); reading it again")
				if s.Observer != nil {
					s.Observer.StepFailed(s.Network.Name, ErrorKind(err))
				}
				caughtUp, err = false, nil
			}
		}()
	} else {
		var halted bool
		if cur, halted, err = s.Store.Cursor(ctx, s.Network.Name); err != nil {
			return false, err
		}
		if halted {
			return false, ErrReorgTooDeep
		}
	}
	// Fast path: the batch after the cursor was read ahead, with the head and
	// the cursor's hash in the same round trip.
	var ahead *prefetch // read ahead for the block after the cursor
	if cur != nil {
		p, err := s.takePrefetch(ctx, cur.Number+1)
		if err != nil {
			return false, err
		}
		if p != nil && p.err == nil && p.batch.Head != nil && p.batch.Parent != nil &&
			*p.batch.Parent == *cur && p.to <= p.batch.Head.Number {
			return s.commitBatch(ctx, cur, nil, "", p.from, p.to, *p.batch.Head, p.batch)
		}
		switch {
		case p != nil && p.err == nil && (p.batch.Parent == nil || *p.batch.Parent == *cur):
			ahead = p // usable once the cursor is checked below
		case p != nil:
			// A read that failed, or one that does not continue the cursor
			// (the chain changed under it): read again from the cursor.
			s.dropPrefetch()
		}
	}

	// Nothing read ahead: while the head is read, read the batch the cursor
	// calls for, when the head known last leaves room for a whole one (or
	// nothing is known yet): a catch-up's first step costs one round trip,
	// not two. A guess the head or the cursor check refutes is dropped.
	if ahead == nil && !(cur == nil && s.Network.StartLatest) {
		guess := s.Network.StartBlock
		if cur != nil {
			guess = cur.Number + 1
		}
		if len(s.ahead) == 0 && (cur == nil || s.lastHead >= guess+s.batch-1) {
			s.startPrefetch(ctx, guess, guess+s.batch-1, s.lastHead)
		}
	}
	// The head, and the cursor block's hash in the same round trip where the
	// source can.
	var head Head
	cursorHash := ""
	if hh, ok := s.Source.(HeadHasher); ok && cur != nil {
		head, cursorHash, err = hh.HeadAndHash(ctx, cur.Number)
	} else {
		head, err = s.Source.Head(ctx)
	}
	if err != nil {
		s.dropPrefetch()
		return false, fmt.Errorf("read head: %w", err)
	}
	var from uint64
	var orphanAbove *uint64
	forkHash := "" // the canonical hash of the fork point, when the walk-back checked one
	switch {
	case cur == nil && s.Network.StartLatest:
		from = head.Number
	case cur == nil:
		from = s.Network.StartBlock
	case cur.Number > head.Number:
		// The node is behind what we scanned (a lagging fallback node, or a
		// reorg to a shorter chain that the next step will see).
		if cached {
			if moved, err := s.knownMoved(ctx, cur); err != nil || moved {
				return false, err
			}
		}
		return true, s.Store.RecordStatus(ctx, s.Network.Name, &head, "", false)
	default:
		hash := cursorHash
		if hash == "" {
			if hash, err = s.Source.BlockHash(ctx, cur.Number); err != nil {
				return false, fmt.Errorf("check cursor block %d: %w", cur.Number, err)
			}
		}
		from = cur.Number + 1
		if hash != cur.Hash && cached {
			// A reorg is walked back from the stored cursor, never from one
			// remembered: an operator may have moved it (and dropped the
			// hashes above it) meanwhile.
			if moved, err := s.knownMoved(ctx, cur); err != nil || moved {
				return false, err
			}
		}
		if hash != cur.Hash {
			above, hash, err := s.forkPoint(ctx, cur)
			if err != nil {
				return false, err
			}
			forkHash = hash
			orphanAbove, from = &above, above+1
			s.Log.Warn("reorg detected", "cursor", cur.Number, "fork_below", above+1)
		}
	}
	if from > head.Number {
		commit := Commit{Network: s.Network.Name, Prev: cur, OrphanAbove: orphanAbove, Cursor: cur, Head: head,
			ConfirmedAtOrBelow: s.confirmedAtOrBelow(head), Window: s.Window}
		if orphanAbove != nil {
			// The new chain is not longer than the fork point yet.
			last, err := s.Source.BlockHash(ctx, *orphanAbove)
			if err != nil {
				return false, err
			}
			commit.Cursor = &Block{Number: *orphanAbove, Hash: last}
		}
		if _, err := s.Store.Commit(ctx, commit); err != nil {
			return false, err
		}
		s.known = commit.Cursor
		return true, nil
	}
	if ahead == nil && len(s.ahead) > 0 {
		if ahead, err = s.takePrefetch(ctx, from); err != nil {
			return false, err
		}
		if ahead != nil && ahead.err != nil {
			ahead = nil
		}
	}
	to := min(head.Number, from+s.batch-1)
	var batch *Batch
	if ahead != nil && orphanAbove == nil && ahead.from == from && ahead.to <= head.Number {
		to, batch = ahead.to, ahead.batch
	} else {
		batch, err = s.scanRange(ctx, from, to, head.Number)
	}
	// A range refused, or one no node answered in time (each was tried:
	// a single sick node fails over instead), is read in halves.
	timedOut := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
	if (errors.Is(err, ErrRangeTooLarge) || timedOut) && to > from {
		s.batch = max((to-from+1)/2, 1)
		s.successes = 0
		s.Log.Info("the range was refused or timed out on every node; halving", "blocks", to-from+1, "now", s.batch, "err", err)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("scan blocks %d-%d: %w", from, to, err)
	}
	return s.commitBatch(ctx, cur, orphanAbove, forkHash, from, to, head, batch)
}

// knownMoved reads the stored cursor before a step acts on the one it
// remembered (known) by anything but a commit, which checks it itself: a
// reorg walked back, a lagging node's head recorded. It reports whether the
// cursor moved (the read-ahead is dropped: the next step starts from where
// it is now), or ErrReorgTooDeep when the network is halted.
func (s *Scanner) knownMoved(ctx context.Context, known *Block) (bool, error) {
	stored, halted, err := s.Store.Cursor(ctx, s.Network.Name)
	switch {
	case err != nil:
		return false, err
	case halted:
		return false, ErrReorgTooDeep
	case stored == nil || *stored != *known:
		s.dropPrefetch()
		return true, nil
	}
	return false, nil
}

// commitBatch verifies a scanned batch, starts reading the next one, and
// commits this one with the new cursor.
func (s *Scanner) commitBatch(ctx context.Context, cur *Block, orphanAbove *uint64, forkHash string, from, to uint64, head Head, batch *Batch) (bool, error) {
	if batch.Head != nil && batch.Head.Number > head.Number {
		head = *batch.Head
	}
	// The batch must continue the chain the scanner stands on: its parent
	// is the cursor block, or the fork point a reorg walked back to (when
	// the walk-back found one still canonical; below where scanning began
	// there is none to hold it to). A reorg between the cursor check and
	// the read shows here, not as a batch of the new chain on top of the
	// old cursor.
	var below *Block
	switch {
	case orphanAbove != nil:
		below = &Block{Number: *orphanAbove, Hash: forkHash}
	case cur != nil:
		below = cur
	}
	if below != nil && below.Hash != "" && batch.Parent != nil && *batch.Parent != *below {
		return false, inconsistentError{below.Number}
	}
	if below != nil && below.Hash == "" && batch.Parent != nil && batch.Parent.Number == below.Number {
		// The new anchor below where scanning began: kept, in place of
		// the replaced one.
		batch.Blocks = append(batch.Blocks, *batch.Parent)
	}
	if cur == nil && from > 0 {
		// Anchor the first batch to its parent, so that a reorg reaching
		// below the first scanned block is seen and rescanned.
		anchor := Block{Number: from - 1}
		if batch.Parent != nil && batch.Parent.Number == from-1 {
			anchor.Hash = batch.Parent.Hash
		}
		batch.Blocks = append(batch.Blocks, anchor)
	}
	last, err := s.verify(ctx, batch, from, to, head)
	if err != nil {
		return false, err
	}
	commit := Commit{Network: s.Network.Name, Prev: cur, OrphanAbove: orphanAbove, Batch: batch, Cursor: &last,
		Head: head, ConfirmedAtOrBelow: s.confirmedAtOrBelow(head), Window: s.Window, First: from}
	// While this batch commits, read the next one: fetching and storing
	// overlap, which matters most when the node is far away.
	s.lastHead = head.Number
	s.readAhead(ctx, last.Number, head.Number)
	orphaned, err := s.Store.Commit(ctx, commit)
	if err != nil {
		return false, err
	}
	s.known = commit.Cursor
	if orphanAbove != nil {
		s.Log.Warn("reorg handled", "fork_below", *orphanAbove+1, "orphaned_transfers", orphaned)
	}
	s.successes++
	if s.successes >= growAfterSuccesses && s.batch < s.MaxBatch {
		s.batch = min(s.batch*2, s.MaxBatch)
		s.successes = 0
	}
	if n := len(batch.Transfers); n > 0 {
		s.Log.Info("transfers found", "from", from, "to", last.Number, "count", n)
	}
	s.Log.Debug("batch committed", "from", from, "to", last.Number, "head", head.Number, "transfers", len(batch.Transfers),
		"took", time.Since(s.stepStart).Round(time.Microsecond))
	if s.verifyWake != nil && last.Number >= head.Number {
		// At the head, what was recorded is checked at once. During a
		// catch-up the checks run at each poll interval instead, so that
		// their calls do not slow the scan (confirmations take blocks
		// anyway).
		select {
		case s.verifyWake <- struct{}{}:
		default:
		}
	}
	if s.Observer != nil {
		s.Observer.Batch(s.Network.Name, int(last.Number-from+1), len(batch.Transfers), time.Since(s.stepStart))
	}
	s.logProgress(time.Now(), last.Number, head.Number)
	return last.Number >= head.Number, nil
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

// verify checks that the batch's last block, and every block within the
// reorg window of the head (or just below it: keptFrom) that holds a
// transfer, are still canonical. It also fills in the hash of every such
// scanned block, so that a later reorg can be walked back block by block,
// a catch-up's as a step's. Blocks deeper than the window are not
// fetched: a reorg that deep halts the scanner at its next cursor check,
// so catching up needs no header for blocks of the past.
// It returns the batch's last block.
func (s *Scanner) verify(ctx context.Context, b *Batch, from, to uint64, head Head) (Block, error) {
	// Only what the range holds: a source that answered for other blocks
	// (a node or relay that ignores the range it was asked for) would move
	// the cursor past blocks nobody read.
	for _, blk := range b.Blocks {
		if blk.Number+1 < from || blk.Number > to {
			return Block{}, fmt.Errorf("the source answered for blocks %d-%d with block %d", from, to, blk.Number)
		}
	}
	for _, t := range b.Transfers {
		if t.BlockNumber < from || t.BlockNumber > to {
			return Block{}, fmt.Errorf("the source answered for blocks %d-%d with a transfer in block %d (%s)", from, to,
				t.BlockNumber, t.TxHash)
		}
	}
	recent := max(from, s.keptFrom(head.Number))
	reported := map[uint64]string{}
	deep := map[uint64]string{} // hashes of blocks below the window, as reported
	for _, blk := range b.Blocks {
		if blk.Number >= recent || blk.Number == to || blk.Number+1 == from {
			reported[blk.Number] = blk.Hash
		}
	}
	for _, t := range b.Transfers {
		m := reported
		if t.BlockNumber < recent {
			m = deep
		}
		if h, ok := m[t.BlockNumber]; ok && h != "" && h != t.BlockHash {
			return Block{}, inconsistentError{t.BlockNumber}
		}
		m[t.BlockNumber] = t.BlockHash
	}
	if _, ok := reported[to]; !ok {
		reported[to] = ""
	}
	for n := recent; n <= to; n++ {
		if _, ok := reported[n]; !ok {
			reported[n] = ""
		}
	}
	// Fetch the canonical hash of recent blocks and of any whose hash the
	// source did not report; below the window the source's word stands.
	// Hashes the source read in the same round trip as the transfers
	// (Batch.Hashes) need no second one.
	var numbers []uint64
	for n, h := range reported {
		if c, ok := b.Hashes[n]; ok && c != "" {
			if h != "" && c != h {
				return Block{}, inconsistentError{n}
			}
			reported[n] = c
			continue
		}
		if n >= recent || h == "" {
			numbers = append(numbers, n)
		}
	}
	slices.Sort(numbers)
	canonical, err := blockHashes(ctx, s.Source, numbers)
	if err != nil {
		return Block{}, fmt.Errorf("check batch blocks: %w", err)
	}
	for i, n := range numbers {
		if canonical[i] == "" || (reported[n] != "" && canonical[i] != reported[n]) {
			return Block{}, inconsistentError{n}
		}
		reported[n] = canonical[i]
	}
	b.Blocks = b.Blocks[:0]
	all := make([]uint64, 0, len(reported))
	for n := range reported {
		all = append(all, n)
	}
	slices.Sort(all)
	for _, n := range all {
		b.Blocks = append(b.Blocks, Block{Number: n, Hash: reported[n]})
	}
	return b.Blocks[len(b.Blocks)-1], nil
}

// forkPoint walks the stored hashes down from the cursor to the highest
// block still on the canonical chain and returns its height and hash:
// everything above it is to be rescanned. (Below where scanning began, the
// height comes with no hash.)
func (s *Scanner) forkPoint(ctx context.Context, cur *Block) (uint64, string, error) {
	stored, err := s.Store.RecentBlocks(ctx, s.Network.Name, cur.Number)
	if err != nil {
		return 0, "", err
	}
	if len(stored) == 0 {
		return 0, "", fmt.Errorf("%w: no block hashes kept below %d", ErrReorgTooDeep, cur.Number)
	}
	numbers := make([]uint64, len(stored))
	for i, b := range stored {
		numbers[i] = b.Number
	}
	canonical, err := blockHashes(ctx, s.Source, numbers)
	if err != nil {
		return 0, "", fmt.Errorf("walk back to the fork: %w", err)
	}
	for i, b := range stored {
		if canonical[i] == b.Hash {
			return b.Number, b.Hash, nil
		}
	}
	// No kept hash is canonical any more. That is a guess unless scanning
	// began less than a window ago: then rescan from where it began.
	first, known, err := s.Store.FirstBlock(ctx, s.Network.Name)
	if err != nil {
		return 0, "", err
	}
	if !known || cur.Number-first >= s.Window {
		return 0, "", fmt.Errorf("%w (%d blocks below %d)", ErrReorgTooDeep, s.Window, cur.Number)
	}
	if first == 0 {
		return 0, "", fmt.Errorf("%w: genesis changed", ErrReorgTooDeep)
	}
	return first - 1, "", nil
}

// HeadHasher is implemented by Sources that read the head and a block's
// hash in one round trip ("" for the hash when there is no such block).
type HeadHasher interface {
	HeadAndHash(ctx context.Context, n uint64) (Head, string, error)
}

// HashScanner is implemented by Sources that, in the same round trip as a
// range's transfers, read the canonical hashes of chosen blocks
// (Batch.Hashes): the scanner asks for those it must check.
type HashScanner interface {
	ScanWithHashes(ctx context.Context, from, to uint64, heights []uint64) (*Batch, error)
}

// RangeLimiter is implemented by Sources whose blocks are heavy to read
// (Bitcoin's raw blocks): a batch spans at most MaxRange blocks.
type RangeLimiter interface {
	MaxRange() uint64
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
