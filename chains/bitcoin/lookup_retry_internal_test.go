package bitcoin

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/btcsuite/btcd/chaincfg/chainhash"
	"github.com/btcsuite/btcd/txscript"
	"github.com/btcsuite/btcd/wire"

	"github.com/paywatch/paywatch"
)

// A look-up whose first attempt read the transaction in a block, and whose
// connection then dropped, is asked again; by then the block was replaced
// and the node reports the transaction back in its mempool. The look-up
// finds nothing mined: nothing of the failed attempt is kept (an answer
// decoded over the last would keep its block hash, which the new answer
// leaves out).
func TestLookupKeepsNothingOfAFailedAttempt(t *testing.T) {
	addr, err := btcutil.NewAddressWitnessPubKeyHash(bytes.Repeat([]byte{7}, 20), &chaincfg.RegressionNetParams)
	if err != nil {
		t.Fatal(err)
	}
	script, _ := txscript.PayToAddrScript(addr)
	tx := wire.NewMsgTx(2)
	tx.AddTxIn(wire.NewTxIn(wire.NewOutPoint(&chainhash.Hash{1}, 0), nil, nil))
	tx.AddTxOut(wire.NewTxOut(50_000, script))
	var b bytes.Buffer
	_ = tx.Serialize(&b)
	raw, txid := hex.EncodeToString(b.Bytes()), tx.TxHash().String()
	stale := strings.Repeat("ab", 32) // the block the tx was in, reorganised away meanwhile
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := requests.Add(1)
		body, _ := io.ReadAll(r.Body)
		var q struct {
			Method string `json:"method"`
		}
		_ = json.Unmarshal(body, &q)
		switch {
		case n == 2: // the connection drops under getblockheader
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		case q.Method == "getrawtransaction" && n == 1:
			_, _ = w.Write([]byte(`{"id":0,"result":{"hex":"` + raw + `","blockhash":"` + stale + `"},"error":null}`))
		case q.Method == "getrawtransaction": // back in the mempool: no blockhash
			_, _ = w.Write([]byte(`{"id":0,"result":{"hex":"` + raw + `"},"error":null}`))
		case q.Method == "getblockheader": // Core serves a stale block's header (confirmations -1)
			_, _ = w.Write([]byte(`{"id":0,"result":{"height":101,"time":1764493800,"confirmations":-1},"error":null}`))
		}
	}))
	defer srv.Close()
	n := &paywatch.Network{Name: "btc", Family: paywatch.FamilyBitcoin, Chain: "regtest", RPCURLs: []string{srv.URL},
		Assets: []*paywatch.Asset{{Symbol: "BTC", Native: true, Decimals: 8}}}
	watch, err := NewWatchSet("regtest", []string{addr.EncodeAddress()}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(n, Credentials{}, watch, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	src.nodes.Check = nil
	found, err := src.LookupTx(context.Background(), txid)
	if err != nil || len(found) > 0 || requests.Load() != 3 {
		t.Fatalf("after %d requests: %d found (%v), want none, from the third request", requests.Load(), len(found), err)
	}
}
