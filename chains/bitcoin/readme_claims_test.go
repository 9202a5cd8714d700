package bitcoin_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// envOn is an env on a node already running (tests share one): a fresh
// database, a network that starts at the node's height now, and a watch
// set of the shared addresses and of VPub's addresses as handed out by
// given.
func envOn(t *testing.T, node *btctest.Node, chain string, shared []string, given bitcoin.Given) *env {
	t.Helper()
	asset := &paywatch.Asset{Network: "btc", Symbol: "BTC", Native: true, Decimals: 8, Dust: big.NewInt(546),
		Mode: paywatch.ModePerOrder, XPub: reconciletest.VPub}
	n := &paywatch.Network{Name: "btc", Family: paywatch.FamilyBitcoin, Chain: chain, RPCURLs: []string{node.URL},
		Confirmations: 2, PollInterval: 50 * time.Millisecond, StartBlock: node.Height(), Assets: []*paywatch.Asset{asset}}
	var derivers map[string]*bitcoin.Deriver
	if given != nil {
		derivers = reconciletest.Wallets(t)
	}
	watch, err := bitcoin.NewWatchSet(chain, shared, derivers, given)
	if err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	return &env{t: t, node: node, db: db, store: scan.NewStore(db), network: n, asset: asset, watch: watch}
}

// rpcLog is a JSON-RPC proxy in front of a node (plain HTTP to paywatch,
// the node's TLS behind) that notes the calls of each request, when it came
// and when it was answered; it can alter one raw block on the way.
type rpcLog struct {
	*httptest.Server
	mu       sync.Mutex
	requests []rpcRequest
	// corrupt is the hash of the block whose raw bytes are altered (its
	// last transaction's lock time): its transactions no longer match its
	// header.
	corrupt string
}

type rpcCall struct {
	ID     json.RawMessage   `json:"id"`
	Method string            `json:"method"`
	Params []json.RawMessage `json:"params"`
}

// rpcRequest is one HTTP request: its calls, when it came and when it was
// answered.
type rpcRequest struct {
	calls      []rpcCall
	start, end time.Time
}

func newRPCLog(t *testing.T, node *btctest.Node) *rpcLog {
	t.Helper()
	pem, err := os.ReadFile(node.Credentials.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	l := &rpcLog{}
	l.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := rpcRequest{start: time.Now()}
		body, _ := io.ReadAll(r.Body)
		trimmed := bytes.TrimSpace(body)
		batch := len(trimmed) > 0 && trimmed[0] == '['
		if batch {
			_ = json.Unmarshal(trimmed, &req.calls)
		} else {
			var one rpcCall
			_ = json.Unmarshal(trimmed, &one)
			req.calls = []rpcCall{one}
		}
		l.mu.Lock()
		corrupt := l.corrupt
		l.mu.Unlock()
		fwd, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, node.URL, bytes.NewReader(body))
		fwd.Header = r.Header.Clone()
		res, err := client.Do(fwd)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		out, _ := io.ReadAll(res.Body)
		if corrupt != "" {
			out = alterBlock(out, batch, req.calls, corrupt)
		}
		// Noted before the answer leaves: a caller that has its answer
		// finds its request noted.
		req.end = time.Now()
		l.mu.Lock()
		l.requests = append(l.requests, req)
		l.mu.Unlock()
		w.Header().Set("Content-Type", res.Header.Get("Content-Type"))
		w.WriteHeader(res.StatusCode)
		_, _ = w.Write(out)
	}))
	t.Cleanup(l.Close)
	return l
}

// alterBlock changes the last byte of the raw block hash in the answers
// out to calls.
func alterBlock(out []byte, batch bool, calls []rpcCall, hash string) []byte {
	alter := map[string]bool{}
	for _, c := range calls {
		var h string
		if c.Method == "getblock" && len(c.Params) > 0 && json.Unmarshal(c.Params[0], &h) == nil && h == hash {
			alter[string(c.ID)] = true
		}
	}
	if len(alter) == 0 {
		return out
	}
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
	return out
}

// take returns the calls of the requests noted so far and forgets them.
func (l *rpcLog) take() [][]rpcCall {
	var out [][]rpcCall
	for _, r := range l.takeRequests() {
		out = append(out, r.calls)
	}
	return out
}

// takeRequests returns the requests noted so far and forgets them.
func (l *rpcLog) takeRequests() []rpcRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.requests
	l.requests = nil
	return out
}

// takeBlockReads returns the requests noted so far that read raw blocks,
// with the hashes each read, and forgets them all.
func (l *rpcLog) takeBlockReads() []blockRead {
	var reads []blockRead
	for _, r := range l.takeRequests() {
		var hashes []string
		for _, c := range r.calls {
			var h string
			if c.Method == "getblock" && len(c.Params) > 0 && json.Unmarshal(c.Params[0], &h) == nil {
				hashes = append(hashes, h)
			}
		}
		if len(hashes) > 0 {
			reads = append(reads, blockRead{hashes: hashes, start: r.start, end: r.end})
		}
	}
	return reads
}

// blockRead is one request reading raw blocks.
type blockRead struct {
	hashes     []string
	start, end time.Time
}

// The README's claims about the Bitcoin watcher, on one btcd node.
func TestBitcoinWatcherReadme(t *testing.T) {
	node := btctest.New(t)

	// "Blocks are read raw (`getblock` verbosity 0) ...; up to 25 blocks a
	// batch, 4 per request": a catch-up of 60 blocks reads them in batches
	// of at most 25 blocks (one request for the head and the range's
	// hashes), their raw blocks at most 4 per request, each block once.
	t.Run("CatchUpReadsUpTo25BlocksABatch4PerRequest", func(t *testing.T) {
		shop := shopAddress(t, 41)
		e := envOn(t, node, "regtest", []string{shop}, nil)
		rpc := newRPCLog(t, node)
		e.network.RPCURLs = []string{rpc.URL}
		src, err := bitcoin.NewSource(e.network, bitcoin.Credentials{User: node.Credentials.User, Pass: node.Credentials.Pass},
			e.watch, testLog())
		if err != nil {
			t.Fatal(err)
		}
		s := scan.NewScanner(e.network, src, e.store, testLog())
		e.sync(s)
		start := node.Height()
		paid := map[string]bool{}
		for i := 1; i <= 60; i++ {
			if i == 1 || i == 30 || i == 60 {
				paid[node.Pay(btctest.Output{Address: shop, Sats: int64(100_000 + i)})] = true
			}
			node.Mine(1)
		}
		rpc.take()
		e.sync(s)
		requests := rpc.take()

		read := map[string]int{} // raw block hash → times read
		maxPerRequest, maxPerBatch, batches := 0, 0, 0
		for _, calls := range requests {
			raw := 0
			for _, c := range calls {
				if c.Method != "getblock" {
					continue
				}
				raw++
				var hash string
				var verbosity int
				if len(c.Params) != 2 || json.Unmarshal(c.Params[0], &hash) != nil ||
					json.Unmarshal(c.Params[1], &verbosity) != nil || verbosity != 0 {
					t.Fatalf("a block read other than raw (getblock hash 0): %s", c.Params)
				}
				read[hash]++
			}
			if raw > 4 {
				t.Errorf("one request read %d raw blocks, the README says 4 at most", raw)
			}
			maxPerRequest = max(maxPerRequest, raw)
			// A batch starts with one request for the head and the hashes
			// of the range and of its parent.
			if len(calls) > 2 && calls[0].Method == "getblockcount" {
				blocks := len(calls) - 2
				batches++
				if blocks > 25 {
					t.Errorf("a batch of %d blocks, the README says 25 at most", blocks)
				}
				maxPerBatch = max(maxPerBatch, blocks)
			}
		}
		t.Logf("the catch-up: %d requests, %d batches, %d blocks read", len(requests), batches, len(read))
		if maxPerBatch != 25 || maxPerRequest != 4 {
			t.Errorf("a catch-up of 60 blocks read at most %d blocks a batch (%d batches) and %d a request, want 25 and 4",
				maxPerBatch, batches, maxPerRequest)
		}
		for h := start + 1; h <= start+60; h++ {
			hash, err := node.H.Client.GetBlockHash(int64(h))
			if err != nil {
				t.Fatal(err)
			}
			if read[hash.String()] != 1 {
				t.Errorf("block %d was read %d times, want once", h, read[hash.String()])
			}
		}
		got := e.transfers()
		for _, r := range got {
			delete(paid, r.TxHash)
		}
		if len(got) != 3 || len(paid) != 0 {
			t.Errorf("the catch-up found %d transfers (%+v), want the 3 payments", len(got), got)
		}
	})

	// "every address handed out to an order ... and the next 1,000 of each
	// extended key": with orders handed the key's addresses 0 to 2, a
	// payment to address 1,002 (the last handed out + 1,000) is found, one
	// to address 1,003 is not.
	t.Run("WatchesTheNext1000AddressesOfAnExtendedKey", func(t *testing.T) {
		e := envOn(t, node, "regtest", nil, nil)
		wallets := reconciletest.Wallets(t)
		store := orders.NewStore(e.db, 24*time.Hour, wallets)
		var err error
		if e.watch, err = bitcoin.NewWatchSet("regtest", nil, wallets, store); err != nil {
			t.Fatal(err)
		}
		if e.watch.Lookahead != 1000 || bitcoin.DefaultLookahead != 1000 {
			t.Fatalf("a watch set looks %d addresses ahead (DefaultLookahead %d), the README says 1,000",
				e.watch.Lookahead, bitcoin.DefaultLookahead)
		}
		for i := 0; i < 3; i++ {
			createOrder(t, store, e.network, fmt.Sprintf("ahead-%d", i))
		}
		s := e.scanner()
		e.sync(s)
		d := wallets[reconciletest.VPub]
		last, _ := d.Address(2)
		edge, _ := d.Address(2 + 1000)
		beyond, _ := d.Address(2 + 1001)
		node.Pay(btctest.Output{Address: last, Sats: 100_000}, btctest.Output{Address: edge, Sats: 110_000},
			btctest.Output{Address: beyond, Sats: 120_000})
		node.Mine(1)
		e.sync(s)
		got := map[string]bool{}
		for _, r := range e.transfers() {
			got[r.To] = true
		}
		if !got[last] || !got[edge] || got[beyond] || len(got) != 2 {
			t.Fatalf("payments found to %v; want the last address handed out (index 2) and index 1,002, not index 1,003", got)
		}
	})

	// "(should more orders than that be created while a batch is read, the
	// batch is read again with the grown set)": orders created while a
	// batch is read take addresses past what the watch set held; the batch
	// is read again, and a payment in it to one of those addresses is found.
	t.Run("OrdersCreatedPastTheLookaheadDuringABatchAreReadAgain", func(t *testing.T) {
		e := envOn(t, node, "regtest", nil, nil)
		wallets := reconciletest.Wallets(t)
		store := orders.NewStore(e.db, 24*time.Hour, wallets)
		grow := &growingGiven{store: store}
		var err error
		if e.watch, err = bitcoin.NewWatchSet("regtest", nil, wallets, grow); err != nil {
			t.Fatal(err)
		}
		e.watch.Lookahead = 5 // the rule does not depend on the size
		for i := 0; i < 3; i++ {
			createOrder(t, store, e.network, fmt.Sprintf("grow-%d", i))
		}
		s := e.scanner()
		e.sync(s) // watched: addresses 0 to 7
		d := wallets[reconciletest.VPub]
		late, _ := d.Address(8)
		txid := node.Pay(btctest.Output{Address: late, Sats: 130_000})
		node.Mine(1)
		// While the next batch is read, six orders are created: the last
		// takes address 8, which the set did not hold when the batch began.
		grow.arm(func(ctx context.Context) {
			for i := 3; i < 9; i++ {
				o := createOrder(t, store, e.network, fmt.Sprintf("grow-%d", i))
				if i == 8 && o.PayAddress != late {
					t.Errorf("the 9th order got %s, not address 8 (%s)", o.PayAddress, late)
				}
			}
		})
		outgrown := 0
		for i := 0; ; i++ {
			caughtUp, err := s.Step(t.Context())
			switch {
			case err != nil && strings.Contains(err.Error(), "reading them again"):
				outgrown++
			case err != nil:
				t.Fatalf("step %d: %v", i, err)
			}
			if caughtUp || i > 50 {
				break
			}
		}
		if !grow.fired() {
			t.Fatal("no batch was read after the orders were armed: the test tests nothing")
		}
		if outgrown != 1 {
			t.Errorf("the scanner reported %d outgrown watch sets, want 1 (the batch read again)", outgrown)
		}
		found := false
		for _, r := range e.transfers() {
			found = found || (r.TxHash == txid && r.To == late)
		}
		if !found {
			t.Fatalf("the payment to address 8, handed out while its block was read, was missed: transfers %+v", e.transfers())
		}
	})

	// "The node is checked to be on the configured chain
	// (`getblockchaininfo`)": a regtest node configured as testnet is
	// refused with an error naming both chains, and nothing is scanned,
	// looked up or read from its mempool.
	t.Run("NodeOnAnotherChainIsRefused", func(t *testing.T) {
		shop := shopAddress(t, 42) // P2PKH: the same address on testnet and regtest
		e := envOn(t, node, "testnet", []string{shop}, nil)
		txid := node.Pay(btctest.Output{Address: shop, Sats: 140_000})
		node.Mine(1)
		node.Pay(btctest.Output{Address: shop, Sats: 150_000}) // left in the mempool
		const want = `node is on chain "regtest", the configuration says testnet`
		s := e.scanner()
		for i := 0; i < 3; i++ {
			if _, err := s.Step(t.Context()); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("scanner step %d on a regtest node configured as testnet: %v, want an error saying %q", i, err, want)
			}
		}
		src, err := bitcoin.NewSource(e.network, e.node.Credentials, e.watch, testLog())
		if err != nil {
			t.Fatal(err)
		}
		if found, err := src.LookupTx(t.Context(), txid); err == nil || !strings.Contains(err.Error(), want) || len(found) != 0 {
			t.Fatalf("a look-up on the node on another chain: %+v, %v", found, err)
		}
		if _, err := bitcoin.NewMempool(src, e.db, testLog()).Step(t.Context()); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("a mempool read on the node on another chain: %v", err)
		}
		var cursors, sightings int
		if err := e.db.Get(&cursors, `SELECT count(*) FROM chain_cursors WHERE block_number IS NOT NULL`); err != nil {
			t.Fatal(err)
		}
		if err := e.db.Get(&sightings, `SELECT count(*) FROM mempool_transfers`); err != nil {
			t.Fatal(err)
		}
		if got := e.transfers(); len(got) != 0 || cursors != 0 || sightings != 0 {
			t.Fatalf("a node on another chain was read: %d transfers, %d cursors moved, %d mempool sightings", len(got), cursors, sightings)
		}
	})
}

// createOrder creates an order on the network's per-order asset, which
// hands it the key's next address.
func createOrder(t *testing.T, store *orders.Store, n *paywatch.Network, id string) *paywatch.Order {
	t.Helper()
	o, _, err := store.Create(context.Background(), orders.CreateRequest{ExternalID: id, Network: n, Asset: n.Assets[0],
		Amount: big.NewInt(100_000), ExpiresIn: time.Hour, Actor: "shop"})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// growingGiven is the order store, and runs a function once, when armed,
// the first time the watch set asks whether addresses were handed out
// while blocks were read (a read of no addresses).
type growingGiven struct {
	store bitcoin.Given
	mu    sync.Mutex
	then  func(ctx context.Context)
	done  bool
}

func (g *growingGiven) arm(f func(ctx context.Context)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.then = f
}

func (g *growingGiven) fired() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.done
}

func (g *growingGiven) Given(ctx context.Context, xpub string, from uint32, limit int) ([]string, uint32, error) {
	g.mu.Lock()
	if limit == 0 && g.then != nil && !g.done {
		g.done = true
		g.then(ctx)
	}
	g.mu.Unlock()
	return g.store.Given(ctx, xpub, from, limit)
}

// README: "the Bitcoin scanner reads one batch ahead, not two (raw blocks
// are large)": a scanner over the Bitcoin source reads one range ahead.
func TestBitcoinScannerReadsOneBatchAhead(t *testing.T) {
	src := &bitcoin.Source{}
	n := &paywatch.Network{Name: "bitcoin", Family: paywatch.FamilyBitcoin}
	s := scan.NewScanner(n, src, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if s.ReadAhead != 1 || scan.DefaultReadAhead != 2 {
		t.Fatalf("the Bitcoin scanner reads %d batches ahead (default %d), want 1", s.ReadAhead, scan.DefaultReadAhead)
	}
}
