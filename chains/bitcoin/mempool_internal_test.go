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
	"testing"

	"github.com/btcsuite/btcd/chaincfg/chainhash"
	"github.com/btcsuite/btcd/wire"

	"github.com/paywatch/paywatch"
)

// A batch of mempool transactions whose answer is over the bound is read
// again in halves; a single transaction over it is skipped; the others
// are all read.
func TestMempoolFetchSplitsLargeAnswers(t *testing.T) {
	raws := map[string]string{}
	var ids []string
	for i := 0; i < 8; i++ {
		tx := wire.NewMsgTx(2)
		tx.AddTxIn(wire.NewTxIn(wire.NewOutPoint(&chainhash.Hash{byte(i)}, 0), nil, nil))
		size := 100
		if i == 5 {
			size = 5_000 // too large alone
		}
		tx.AddTxOut(wire.NewTxOut(1_000, bytes.Repeat([]byte{0x51}, size)))
		var b bytes.Buffer
		_ = tx.Serialize(&b)
		id := tx.TxHash().String()
		raws[id] = hex.EncodeToString(b.Bytes())
		ids = append(ids, id)
	}
	requests := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests++
		body, _ := io.ReadAll(r.Body)
		var reqs []struct {
			ID     int   `json:"id"`
			Params []any `json:"params"`
		}
		if !bytes.HasPrefix(body, []byte("[")) {
			var one struct {
				ID     int   `json:"id"`
				Params []any `json:"params"`
			}
			_ = json.Unmarshal(body, &one)
			reqs = append(reqs, one)
		} else {
			_ = json.Unmarshal(body, &reqs)
		}
		var out []map[string]any
		for _, q := range reqs {
			out = append(out, map[string]any{"id": q.ID, "result": raws[q.Params[0].(string)], "error": nil})
		}
		_ = json.NewEncoder(w).Encode(out)
	}))
	defer srv.Close()
	n := &paywatch.Network{Name: "btc", Family: paywatch.FamilyBitcoin, Chain: "regtest", RPCURLs: []string{srv.URL},
		Assets: []*paywatch.Asset{{Symbol: "BTC", Native: true, Decimals: 8}}}
	watch, err := NewWatchSet("regtest", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(n, Credentials{}, watch, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	src.nodes.Check = nil
	src.nodes.Endpoints[0].maxAnswer = 2_000 // about four small transactions
	m := NewMempool(src, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	got, err := m.fetch(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 7 || got[ids[5]] != nil {
		var have []string
		for id := range got {
			have = append(have, id[:8])
		}
		t.Fatalf("read %d transactions (%s), want the 7 small ones", len(got), strings.Join(have, " "))
	}
	if requests < 4 {
		t.Fatalf("%d requests: the batch was not split", requests)
	}
}
