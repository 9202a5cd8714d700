package bitcoin_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcutil"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/bitcoin/btctest"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

const (
	benchBlocks   = 20
	benchOutputs  = 2_000 // per block
	benchWatched  = 1_000_000
	benchPayments = 20 // outputs per block that pay a watched address
)

// randomAddress is a P2WPKH address of a random key hash.
func randomAddress(b testing.TB) string {
	h := make([]byte, 20)
	_, _ = rand.Read(h)
	a, err := btcutil.NewAddressWitnessPubKeyHash(h, btctest.Params)
	if err != nil {
		b.Fatal(err)
	}
	return a.EncodeAddress()
}

// BenchmarkScan compares paywatch's scan of 20 full blocks (2,000 outputs
// each, 20 of them to watched addresses) with a watch set of 1,000,000
// addresses, against a bare loop fetching the same raw blocks from the
// same node over JSON-RPC (getblockhash, then getblock verbosity 0, one
// call at a time): the ratio of the two ns/op is the scanner's
// efficiency. Run:
//
//	go test -run '^$' -bench BenchmarkScan -benchtime 5x ./chains/bitcoin/
func BenchmarkScan(b *testing.B) {
	node := btctest.New(b)
	watched := make([]string, benchWatched)
	for i := range watched {
		watched[i] = randomAddress(b)
	}
	from := node.Height() + 1
	for i := 0; i < benchBlocks; i++ {
		outs := make([]btctest.Output, benchOutputs)
		for j := range outs {
			addr := randomAddress(b)
			if j%(benchOutputs/benchPayments) == 0 {
				addr = watched[(i*benchOutputs+j)*7919%benchWatched]
			}
			outs[j] = btctest.Output{Address: addr, Sats: 1_000}
		}
		node.Pay(outs...)
		node.Mine(1)
	}
	to := node.Height()
	start := time.Now()
	watch, err := bitcoin.NewWatchSet("regtest", watched, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b.Logf("watch set of %d addresses built in %s; heap in use %d MiB", watch.Len(), time.Since(start).Round(time.Millisecond), ms.HeapInuse>>20)
	db := pgtest.New(b)

	b.Run("bare", func(b *testing.B) {
		bare := newBareRPC(b, node)
		for i := 0; i < b.N; i++ {
			size := 0 // bytes of raw blocks read
			for h := from; h <= to; h++ {
				var hash, raw string
				bare.call(b, &hash, "getblockhash", h)
				bare.call(b, &raw, "getblock", hash, 0)
				size += len(raw) / 2
			}
			_ = size
		}
	})
	b.Run("paywatch", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			asset := &paywatch.Asset{Network: "btc", Symbol: "BTC", Native: true, Decimals: 8, Dust: big.NewInt(546)}
			n := &paywatch.Network{Name: fmt.Sprintf("bench-%d-%d", b.N, i), Family: paywatch.FamilyBitcoin, Chain: "regtest",
				RPCURLs: []string{node.URL}, Confirmations: 2, StartBlock: from, Assets: []*paywatch.Asset{asset}}
			src, err := bitcoin.NewSource(n, node.Credentials, watch, testLog())
			if err != nil {
				b.Fatal(err)
			}
			s := scan.NewScanner(n, src, scan.NewStore(db), testLog())
			for {
				caughtUp, err := s.Step(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				if caughtUp {
					break
				}
			}
			b.StopTimer()
			var found int
			if err := db.Get(&found, `SELECT count(*) FROM transfers WHERE network = $1`, n.Name); err != nil || found != benchBlocks*benchPayments {
				b.Fatalf("found %d transfers, want %d (%v)", found, benchBlocks*benchPayments, err)
			}
			b.StartTimer()
		}
	})
}

// bareRPC is the baseline: one JSON-RPC call per HTTP request, nothing
// else.
type bareRPC struct {
	url, user, pass string
	http            *http.Client
}

func newBareRPC(b testing.TB, node *btctest.Node) *bareRPC {
	pem, err := os.ReadFile(node.Credentials.CertFile)
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	return &bareRPC{url: node.URL, user: node.Credentials.User, pass: node.Credentials.Pass, http: &http.Client{Transport: tr}}
}

func (r *bareRPC) call(b testing.TB, out any, method string, params ...any) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "1.0", "id": 1, "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, r.url, bytes.NewReader(body))
	req.SetBasicAuth(r.user, r.pass)
	res, err := r.http.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	var answer struct {
		Result json.RawMessage `json:"result"`
		Error  any             `json:"error"`
	}
	if err := json.NewDecoder(res.Body).Decode(&answer); err != nil || answer.Error != nil {
		b.Fatalf("%s: %v %v", method, err, answer.Error)
	}
	if err := json.Unmarshal(answer.Result, out); err != nil {
		b.Fatal(err)
	}
}
