// Package scan is the chain-family-neutral scanning machinery: per network
// it reads the head, scans (cursor, head] in adaptive batches through a
// Source, detects reorgs by comparing stored block hashes with the
// canonical chain, and commits each batch's transfers together with the new
// cursor in one PostgreSQL transaction. The EVM and Bitcoin adapters plug
// in as Sources.
package scan

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/paywatch/paywatch"
)

// Block is a block's height and hash.
type Block struct {
	Number uint64
	Hash   string
}

// Found is a transfer a Source found in a block.
type Found struct {
	Asset       *paywatch.Asset
	TxHash      string
	TxKey       string // identity within the tx, stable if the tx is mined again elsewhere
	Index       int64  // log, tx or output index, for display
	From, To    string
	Amount      *big.Int
	BlockNumber uint64
	BlockHash   string
	// BlockTime is when the block was made (zero when the node does not
	// say); it decides whether a payment was late.
	BlockTime time.Time
	Flags     []string
}

// Batch is what a Source found in a range of blocks.
type Batch struct {
	Transfers []Found
	// Blocks holds the hashes the source saw: at least the range's last
	// block and every block that holds a transfer.
	Blocks []Block
	// Head and Parent (the block before the range), when the source read
	// them in the same round trip as the range, spare the scanner separate
	// calls when it reads ahead.
	Head   *Head
	Parent *Block
	// Hashes holds canonical hashes read in the same round trip as the
	// transfers, when the scanner asked for them (HashScanner).
	Hashes map[uint64]string
}

// Head is the tip of a chain as a node reports it.
type Head struct {
	Number    uint64
	Finalized uint64 // 0 where the chain has no finality tag
}

// Source is what a chain family adapter gives the scanner.
type Source interface {
	// Head returns the node's current head.
	Head(ctx context.Context) (Head, error)
	// BlockHash returns the canonical hash at a height, or ErrNoBlock when
	// the node has no block there (yet).
	BlockHash(ctx context.Context, n uint64) (string, error)
	// Scan returns the transfers to watched addresses in blocks [from, to].
	// It returns an error wrapping ErrRangeTooLarge when the node refuses the
	// range, so that the scanner retries with a smaller one, and an error
	// (ErrNoBlock) for a range beyond the node's head: the scanner may read
	// a batch before it knows the head, and drops what that read returns if
	// the head proves it wrong.
	Scan(ctx context.Context, from, to uint64) (*Batch, error)
}

// FlagBalancePending marks a transfer recorded before its source verified
// it (the EVM fake-deposit balance check, which costs calls the scan's
// critical path should not wait for). Such a transfer matches no order and
// never confirms until the Verifier's verdict replaces the flag.
const FlagBalancePending = paywatch.FlagBalancePending

// Verifier is implemented by Sources that verify, after the scanner
// recorded them, the transfers they flagged FlagBalancePending.
type Verifier interface {
	// Verify returns a verdict for each transfer it could decide. A
	// transfer left without one (its block is no longer the one it was
	// recorded in, say) stays pending and is tried again.
	Verify(ctx context.Context, pending []Unverified) ([]Verdict, error)
}

// Unverified is a recorded transfer waiting for its source's verdict.
type Unverified struct {
	ID          string
	Contract    string
	To          string
	BlockNumber uint64
	BlockHash   string
}

// Verdict is a Verifier's word on one transfer: Flag is "" when it checks
// out, otherwise the flag it earns in place of FlagBalancePending.
type Verdict struct {
	ID        string
	BlockHash string
	Flag      string
}

// Errors a Source reports.
var (
	ErrRangeTooLarge = errors.New("block range too large for the node")
	ErrNoBlock       = errors.New("no block at that height")
)

// ErrReorgTooDeep stops a network's scanner: the chain changed below the
// window of blocks paywatch keeps, and guessing would risk money.
var ErrReorgTooDeep = errors.New("reorg deeper than the kept window of block hashes")

// inconsistentError reports a batch whose blocks are no longer canonical:
// the chain moved while the batch was read.
type inconsistentError struct{ n uint64 }

func (e inconsistentError) Error() string {
	return fmt.Sprintf("block %d changed while the batch was read; rescanning", e.n)
}
