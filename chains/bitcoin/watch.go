package bitcoin

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/btcsuite/btcd/txscript"
)

// Given tells which addresses paywatch has handed out below an extended
// public key: up to limit of those of indexes from on, in index order, and
// the next index it will hand out. (The order store implements it.)
type Given interface {
	Given(ctx context.Context, xpub string, from uint32, limit int) (addresses []string, next uint32, err error)
}

// givenPage is how many handed-out addresses one read of Given brings: a
// million orders are read in pages, so that loading them never holds them
// all twice.
const givenPage = 50_000

// DefaultLookahead is how many addresses past the last one handed out a
// watch set derives ahead, so that an order created while a batch is
// being read has its address watched already.
const DefaultLookahead = 1000

// WatchSet is the set of output scripts a Bitcoin network's watcher looks
// for: every shared receiving address, every address handed out to an
// order (read from the database, so new orders join without a restart),
// and the next Lookahead ones of each extended key. It is keyed by output
// script: a block's outputs are checked without encoding any address.
type WatchSet struct {
	params    *chaincfg.Params
	given     Given
	Lookahead uint32
	// Page is how many handed-out addresses one read of Given brings
	// (50,000 from NewWatchSet).
	Page int

	// refresh lets one Refresh run at a time (the scanner's and the
	// mempool watcher's): the second finds the first's work done.
	refresh sync.Mutex
	mu      sync.RWMutex
	scripts map[string]struct{}
	keys    []*keyWatch
}

// keyWatch is what a watch set holds of one extended key.
type keyWatch struct {
	xpub    string
	deriver *Deriver
	loaded  uint32 // addresses of indexes below it were read from given
	derived uint32 // addresses of indexes below it are in the set
	next    uint32 // the next index to be handed out, as last read
}

// NewWatchSet returns the watch set of shared addresses and of the
// extended keys' addresses, read through given by Refresh.
func NewWatchSet(chain string, shared []string, derivers map[string]*Deriver, given Given) (*WatchSet, error) {
	params, err := Params(chain)
	if err != nil {
		return nil, err
	}
	w := &WatchSet{params: params, given: given, Lookahead: DefaultLookahead, Page: givenPage, scripts: map[string]struct{}{}}
	for _, a := range shared {
		if err := w.add(a); err != nil {
			return nil, err
		}
	}
	for xpub, d := range derivers {
		w.keys = append(w.keys, &keyWatch{xpub: xpub, deriver: d})
	}
	return w, nil
}

// add puts an address's output script in the set; the caller holds mu.
func (w *WatchSet) add(address string) error {
	a, err := btcutil.DecodeAddress(address, w.params)
	if err != nil {
		return fmt.Errorf("watch %s: %w", address, err)
	}
	script, err := txscript.PayToAddrScript(a)
	if err != nil {
		return fmt.Errorf("watch %s: %w", address, err)
	}
	w.scripts[string(script)] = struct{}{}
	return nil
}

// Refresh reads the addresses handed out since the last refresh and
// derives ahead of the last one. Scanning calls it before every batch.
func (w *WatchSet) Refresh(ctx context.Context) error {
	w.refresh.Lock()
	defer w.refresh.Unlock()
	for _, k := range w.keys {
		for {
			full, err := w.refreshKey(ctx, k)
			if err != nil || !full {
				if err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}

// refreshKey reads one page of a key's handed-out addresses and derives
// ahead; it reports whether the page was full (more may follow).
func (w *WatchSet) refreshKey(ctx context.Context, k *keyWatch) (bool, error) {
	w.mu.RLock()
	from := k.loaded
	w.mu.RUnlock()
	page := w.Page
	if page <= 0 {
		page = givenPage
	}
	var addrs []string
	var next uint32
	if w.given != nil {
		var err error
		if addrs, next, err = w.given.Given(ctx, k.xpub, from, page); err != nil {
			return false, fmt.Errorf("read the addresses of %s…: %w", k.xpub[:12], err)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range addrs {
		if err := w.add(a); err != nil {
			return false, err
		}
	}
	k.loaded = from + uint32(len(addrs))
	k.next = max(next, k.loaded)
	k.derived = max(k.derived, k.loaded)
	if len(addrs) == page {
		return true, nil // derive ahead once every page is read
	}
	for k.derived < k.next+w.Lookahead {
		a, err := k.deriver.Address(k.derived)
		if err != nil {
			return false, err
		}
		if err := w.add(a); err != nil {
			return false, err
		}
		k.derived++
	}
	return false, nil
}

// coverage returns, per extended key, the first index whose address is
// not in the set.
func (w *WatchSet) coverage() []uint32 {
	w.mu.RLock()
	defer w.mu.RUnlock()
	cov := make([]uint32, len(w.keys))
	for i, k := range w.keys {
		cov[i] = k.derived
	}
	return cov
}

// errOutgrown says that orders were handed addresses past what the set
// held while blocks were read with it.
var errOutgrown = errors.New("more orders were created while blocks were read than the watch set looks ahead: reading them again")

// checkCovered fails with errOutgrown when an address beyond cov (from
// coverage, taken before blocks were read) has been handed out since: the
// blocks must be read again with the grown set, or a payment to it could
// be missed.
func (w *WatchSet) checkCovered(ctx context.Context, cov []uint32) error {
	if w.given == nil {
		return nil
	}
	for i, k := range w.keys {
		_, next, err := w.given.Given(ctx, k.xpub, cov[i], 0)
		if err != nil {
			return fmt.Errorf("read the addresses of %s…: %w", k.xpub[:12], err)
		}
		if next > cov[i] {
			return errOutgrown
		}
	}
	return nil
}

// Has reports whether an output script pays a watched address.
func (w *WatchSet) Has(script []byte) bool {
	w.mu.RLock()
	_, ok := w.scripts[string(script)]
	w.mu.RUnlock()
	return ok
}

// Len returns how many scripts are watched.
func (w *WatchSet) Len() int {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return len(w.scripts)
}
