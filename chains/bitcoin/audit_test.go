package bitcoin_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
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

// auBlockFront stands between paywatch and a btcd node (plain HTTP to
// paywatch, the node's TLS behind): it notes when each request reading raw
// blocks came and was answered, and can alter one raw block on the way.
type auBlockFront struct {
	*httptest.Server
	mu      sync.Mutex
	reads   []auBlockRead
	corrupt string // the hash of the block whose raw bytes are altered
}

// auBlockRead is one request reading raw blocks.
type auBlockRead struct {
	hashes     []string
	start, end time.Time
}

func newAUBlockFront(t *testing.T, node *btctest.Node) *auBlockFront {
	t.Helper()
	pem, err := os.ReadFile(node.Credentials.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	f := &auBlockFront{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		body, _ := io.ReadAll(r.Body)
		var calls []struct {
			ID     json.RawMessage   `json:"id"`
			Method string            `json:"method"`
			Params []json.RawMessage `json:"params"`
		}
		batch := bytes.HasPrefix(bytes.TrimSpace(body), []byte("["))
		if batch {
			_ = json.Unmarshal(body, &calls)
		} else {
			calls = calls[:0]
			var one struct {
				ID     json.RawMessage   `json:"id"`
				Method string            `json:"method"`
				Params []json.RawMessage `json:"params"`
			}
			_ = json.Unmarshal(body, &one)
			calls = append(calls, one)
		}
		var hashes []string
		alter := map[string]bool{} // ids of the calls whose block is altered
		f.mu.Lock()
		corrupt := f.corrupt
		f.mu.Unlock()
		for _, c := range calls {
			var hash string
			if c.Method == "getblock" && len(c.Params) > 0 && json.Unmarshal(c.Params[0], &hash) == nil {
				hashes = append(hashes, hash)
				if hash == corrupt {
					alter[string(c.ID)] = true
				}
			}
		}
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, node.URL, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		res, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		out, _ := io.ReadAll(res.Body)
		if len(alter) > 0 {
			var answers []map[string]json.RawMessage
			if batch {
				_ = json.Unmarshal(out, &answers)
			} else {
				var one map[string]json.RawMessage
				_ = json.Unmarshal(out, &one)
				answers = []map[string]json.RawMessage{one}
			}
			for _, a := range answers {
				var raw string
				if alter[string(a["id"])] && json.Unmarshal(a["result"], &raw) == nil && len(raw) > 2 {
					// The last byte (the last transaction's lock time) changed:
					// the transactions no longer match the header.
					last := "00"
					if raw[len(raw)-2:] == "00" {
						last = "01"
					}
					a["result"], _ = json.Marshal(raw[:len(raw)-2] + last)
				}
			}
			if batch {
				out, _ = json.Marshal(answers)
			} else {
				out, _ = json.Marshal(answers[0])
			}
		}
		w.Header().Set("Content-Type", res.Header.Get("Content-Type"))
		w.WriteHeader(res.StatusCode)
		_, _ = w.Write(out)
		if len(hashes) > 0 {
			f.mu.Lock()
			f.reads = append(f.reads, auBlockRead{hashes: hashes, start: start, end: time.Now()})
			f.mu.Unlock()
		}
	}))
	t.Cleanup(f.Close)
	return f
}

// take returns the raw block reads noted so far and forgets them.
func (f *auBlockFront) take() []auBlockRead {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.reads
	f.reads = nil
	return out
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
	front := newAUBlockFront(t, node)
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
	reads := front.take()
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
	if reads := front.take(); len(reads) != 1 {
		var asked []int
		for _, r := range reads {
			asked = append(asked, len(r.hashes))
		}
		t.Fatalf("with a bad block in the first request, %d requests read raw blocks (%v blocks each): "+
			"the blocks after it were read before it was decoded", len(reads), asked)
	}
}
