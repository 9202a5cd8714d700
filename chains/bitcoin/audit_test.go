package bitcoin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/txscript"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// auGiven is the order store, noting each read of the addresses handed out.
type auGiven struct {
	store bitcoin.Given
	mu    sync.Mutex
	reads []string // "from+limit: got"
}

func (g *auGiven) Given(ctx context.Context, xpub string, from uint32, limit int) ([]string, uint32, error) {
	addrs, next, err := g.store.Given(ctx, xpub, from, limit)
	g.mu.Lock()
	g.reads = append(g.reads, fmt.Sprintf("%d+%d: %d", from, limit, len(addrs)))
	g.mu.Unlock()
	return addrs, next, err
}

func (g *auGiven) take() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := g.reads
	g.reads = nil
	return out
}

// README, "Bitcoin": the watch set holds "every address handed out to an
// order (read from the database, in pages, before each batch ...)". With
// pages lowered to 4 addresses and 11 orders in the database, the watch
// set reads them 4, 4 and 3 at a time and watches every one; an order
// created later is read alone, from where the last read ended.
func TestWatchSetReadsHandedOutAddressesInPages(t *testing.T) {
	db := pgtest.New(t)
	wallets := reconciletest.Wallets(t)
	store := orders.NewStore(db, 24*time.Hour, wallets)
	n := &paywatch.Network{Name: "btc", Family: paywatch.FamilyBitcoin, Chain: "regtest", Confirmations: 2,
		Assets: []*paywatch.Asset{{Network: "btc", Symbol: "BTC", Native: true, Decimals: 8, Dust: big.NewInt(546),
			Mode: paywatch.ModePerOrder, XPub: reconciletest.VPub}}}
	var handed []string
	for i := 0; i < 11; i++ {
		handed = append(handed, createOrder(t, store, n, fmt.Sprintf("page-%d", i)).PayAddress)
	}
	given := &auGiven{store: store}
	w, err := bitcoin.NewWatchSet("regtest", nil, wallets, given)
	if err != nil {
		t.Fatal(err)
	}
	if w.Page != 50_000 {
		t.Fatalf("a watch set reads %d addresses a page, want 50,000", w.Page)
	}
	w.Page, w.Lookahead = 4, 5
	if err := w.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(given.take(), ", "), "0+4: 4, 4+4: 4, 8+4: 3"; got != want {
		t.Fatalf("the addresses handed out were read as %q (from+limit: read), want pages of 4: %q", got, want)
	}
	watched := func(addr string) bool {
		a, err := btcutil.DecodeAddress(addr, btctest.Params)
		if err != nil {
			t.Fatal(err)
		}
		script, err := txscript.PayToAddrScript(a)
		if err != nil {
			t.Fatal(err)
		}
		return w.Has(script)
	}
	for i, a := range handed {
		if !watched(a) {
			t.Fatalf("the address of order %d (%s), read in page %d, is not watched", i, a, i/4+1)
		}
	}
	if w.Len() != 11+5 {
		t.Fatalf("%d scripts watched, want the 11 handed out and 5 ahead", w.Len())
	}

	later := createOrder(t, store, n, "page-11").PayAddress
	if err := w.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(given.take(), ", "), "11+4: 1"; got != want {
		t.Fatalf("after one more order the addresses were read as %q, want %q (only the new one)", got, want)
	}
	if !watched(later) {
		t.Fatalf("the address of the order created later (%s) is not watched", later)
	}
}

// README, "Payment detected": the mempool watcher reads "the node's mempool
// (`getrawmempool`, then the new transactions raw)". Two payments in the
// mempool are read raw at the first read; after one more payment, the next
// read fetches that one alone; with nothing new, none.
func TestMempoolFetchesOnlyNewTransactionsRaw(t *testing.T) {
	node := btctest.New(t)
	shop := shopAddress(t, 61)
	e := envOn(t, node, "regtest", []string{shop}, nil)
	rpc := newRPCLog(t, node)
	e.network.RPCURLs = []string{rpc.URL}
	src, err := bitcoin.NewSource(e.network, bitcoin.Credentials{User: node.Credentials.User, Pass: node.Credentials.Pass},
		e.watch, testLog())
	if err != nil {
		t.Fatal(err)
	}
	m := bitcoin.NewMempool(src, e.db, testLog())
	fetched := func() []string {
		var ids []string
		for _, calls := range rpc.take() {
			for _, c := range calls {
				if c.Method != "getrawtransaction" {
					continue
				}
				var id string
				if len(c.Params) > 0 && json.Unmarshal(c.Params[0], &id) == nil {
					ids = append(ids, id)
				}
			}
		}
		return ids
	}
	first := []string{node.Pay(btctest.Output{Address: shop, Sats: 100_000}), node.Pay(btctest.Output{Address: shop, Sats: 110_000})}
	if _, err := m.Step(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := fetched(); len(got) != 2 || !(got[0] == first[0] && got[1] == first[1] || got[0] == first[1] && got[1] == first[0]) {
		t.Fatalf("the first read fetched %v raw, want the 2 payments in the mempool %v", got, first)
	}
	fresh := node.Pay(btctest.Output{Address: shop, Sats: 120_000})
	if _, err := m.Step(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := fetched(); len(got) != 1 || got[0] != fresh {
		t.Fatalf("after one new payment the mempool read fetched %v raw, want the new one alone (%s)", got, fresh)
	}
	if _, err := m.Step(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := fetched(); len(got) != 0 {
		t.Fatalf("with nothing new in the mempool, a read fetched %v raw, want none", got)
	}
	var sightings int
	if err := e.db.Get(&sightings, `SELECT count(*) FROM mempool_transfers`); err != nil || sightings != 3 {
		t.Fatalf("%d sightings recorded (%v), want the 3 payments", sightings, err)
	}
}

// README, "Bitcoin": "up to 25 blocks a batch, 4 per request, each decoded
// and let go before the next are read". A range of 12 blocks is read at
// most 4 raw blocks a request, each request sent once the one before was
// answered;
// and when a block of the first request does not decode as the block asked
// for (its transactions altered on the way), the scan stops there: the
// blocks of the other requests are never asked for, so each request's
// blocks are decoded before the next are read.
func TestRawBlocksDecodedBeforeTheNextAreRead(t *testing.T) {
	node := btctest.New(t)
	shop := shopAddress(t, 62)
	e := envOn(t, node, "regtest", []string{shop}, nil)
	front := newRPCLog(t, node)
	e.network.RPCURLs = []string{front.URL}
	src, err := bitcoin.NewSource(e.network, bitcoin.Credentials{User: node.Credentials.User, Pass: node.Credentials.Pass},
		e.watch, testLog())
	if err != nil {
		t.Fatal(err)
	}
	from := node.Height() + 1
	for i := 0; i < 12; i++ {
		node.Pay(btctest.Output{Address: shop, Sats: int64(100_000 + i)})
		node.Mine(1)
	}
	b, err := src.Scan(t.Context(), from, from+11)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Transfers) != 12 {
		t.Fatalf("%d payments found in 12 blocks, want 12", len(b.Transfers))
	}
	reads := front.takeBlockReads()
	var widths []int
	total := 0
	for i, r := range reads {
		widths = append(widths, len(r.hashes))
		total += len(r.hashes)
		if len(r.hashes) > 4 {
			t.Fatalf("request %d read %d raw blocks, want 4 at most", i, len(r.hashes))
		}
		if i > 0 && r.start.Before(reads[i-1].end) {
			t.Fatalf("request %d for raw blocks was sent before request %d was answered", i, i-1)
		}
	}
	if total != 12 || len(reads) < 3 {
		t.Fatalf("12 blocks read as %v raw blocks a request, want each once, 4 a request at most", widths)
	}

	bad, err := node.H.Client.GetBlockHash(int64(from + 1))
	if err != nil {
		t.Fatal(err)
	}
	front.mu.Lock()
	front.corrupt = bad.String()
	front.mu.Unlock()
	_, err = src.Scan(t.Context(), from, from+11)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("block %d:", from+1)) || !strings.Contains(err.Error(), "merkle root") {
		t.Fatalf("a scan with block %d altered on the way: %v, want it refused for its merkle root", from+1, err)
	}
	if reads := front.takeBlockReads(); len(reads) != 1 {
		var asked []int
		for _, r := range reads {
			asked = append(asked, len(r.hashes))
		}
		t.Fatalf("with a bad block in the first request, %d requests read raw blocks (%v blocks each): "+
			"the blocks after it were read before it was decoded", len(reads), asked)
	}
}
