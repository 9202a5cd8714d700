package evm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
)

// What the source takes from a node's answers, with nodes that lie or fail.
// The node here is a JSON-RPC server in the test (a real node cannot be
// made to answer these): it serves headers for any height (block n's hash
// is n in hex, its time 1,690,000,000 + n), a head at 200, and the logs and
// receipt given.

const (
	testToken = "0x5fbdb2315678afecb367f032d93f642f64180aa3"
	testShop  = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
)

func blockHashOf(n int) string { return fmt.Sprintf("0x%064x", n) }

// transferLog is a Transfer of 1 USDT to the shop in block n (index i of
// transaction tx), with extra fields added or, when extra names a field
// with a value of "-", that field left out.
func transferLog(n, i int, tx string, extra ...string) string {
	fields := []string{
		`"address":"` + testToken + `"`,
		`"topics":["0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef",` +
			`"0x000000000000000000000000f39fd6e51aad88f6f4ce6ab8827279cfffb92266",` +
			`"0x000000000000000000000000` + strings.TrimPrefix(testShop, "0x") + `"]`,
		`"data":"0x` + fmt.Sprintf("%064x", 1_000_000) + `"`,
		fmt.Sprintf(`"blockNumber":"0x%x"`, n),
		`"blockHash":"` + blockHashOf(n) + `"`,
		`"transactionHash":"` + tx + `"`,
		`"transactionIndex":"0x0"`,
		fmt.Sprintf(`"logIndex":"0x%x"`, i),
		`"removed":false`,
	}
	for _, e := range extra {
		name, value, _ := strings.Cut(e, ":")
		kept := fields[:0]
		for _, f := range fields {
			if !strings.HasPrefix(f, name+":") {
				kept = append(kept, f)
			}
		}
		fields = kept
		if value != `"-"` {
			fields = append(fields, e)
		}
	}
	return "{" + strings.Join(fields, ",") + "}"
}

func txHash(b byte) string { return "0x" + strings.Repeat(fmt.Sprintf("%02x", b), 32) }

// answeringNode serves logs for eth_getLogs and a receipt of block
// receiptBlock holding receiptLogs.
func answeringNode(t *testing.T, logs string, receiptBlock int, receiptLogs string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		single := len(body) > 0 && body[0] != '['
		if single {
			body = []byte("[" + string(body) + "]")
		}
		var calls []struct {
			ID     json.RawMessage   `json:"id"`
			Method string            `json:"method"`
			Params []json.RawMessage `json:"params"`
		}
		if err := json.Unmarshal(body, &calls); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var out []string
		for _, c := range calls {
			result := "null"
			switch c.Method {
			case "eth_chainId":
				result = `"0x539"`
			case "eth_getBlockByNumber", "eth_getBlockByHash":
				var tag string
				_ = json.Unmarshal(c.Params[0], &tag)
				n := 200
				if c.Method == "eth_getBlockByHash" {
					n = receiptBlock
				} else if tag != "latest" && tag != "finalized" && tag != "safe" {
					_, _ = fmt.Sscanf(tag, "0x%x", &n)
				}
				result = fmt.Sprintf(`{"number":"0x%x","hash":"%s","timestamp":"0x%x"}`, n, blockHashOf(n), 1_690_000_000+n)
			case "eth_getLogs":
				result = logs
			case "eth_getTransactionReceipt":
				result = fmt.Sprintf(`{"status":"0x1","blockNumber":"0x%x","blockHash":"%s","logs":%s}`,
					receiptBlock, blockHashOf(receiptBlock), receiptLogs)
			case "eth_getTransactionByHash":
				result = fmt.Sprintf(`{"hash":"%s","from":"0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266","to":"%s","value":"0x0","transactionIndex":"0x0"}`,
					txHash(1), testToken)
			}
			out = append(out, `{"jsonrpc":"2.0","id":`+string(c.ID)+`,"result":`+result+`}`)
		}
		w.Header().Set("Content-Type", "application/json")
		if single {
			_, _ = io.WriteString(w, out[0])
			return
		}
		_, _ = io.WriteString(w, "["+strings.Join(out, ",")+"]")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// sourceOn is a source watching testShop for USDT, on the nodes given in
// that order.
func sourceOn(t *testing.T, nodes ...*httptest.Server) *Source {
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.URL)
	}
	n := &paywatch.Network{Name: "test", Family: paywatch.FamilyEVM, RPCURLs: urls, ChainID: 1337, Confirmations: 1,
		Assets: []*paywatch.Asset{{Network: "test", Symbol: "USDT", Contract: testToken, Decimals: 6,
			Mode: paywatch.ModeShared, Addresses: []string{testShop}}}}
	s, err := NewSource(n, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// A node whose answer is refused fails over to the next, and nothing of
// its answer stays in the next node's: neither a field the next one leaves
// out (a forged block time), nor what makes a log whole (an address).
func TestScanTakesEachNodesAnswerAlone(t *testing.T) {
	ctx := context.Background()
	forged := transferLog(100, 0, txHash(1), `"blockTimestamp":"0x1"`)
	broken := transferLog(100, 1, txHash(2), `"address":"-"`)
	honest := answeringNode(t, "["+transferLog(100, 0, txHash(1))+"]", 0, "[]")
	b, err := sourceOn(t, answeringNode(t, "["+forged+","+broken+"]", 0, "[]"), honest).ScanWithHashes(ctx, 100, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Transfers) != 1 {
		t.Fatalf("%d transfers, want the honest node's 1", len(b.Transfers))
	}
	if got, want := b.Transfers[0].BlockTime, time.Unix(1_690_000_100, 0).UTC(); !got.Equal(want) {
		t.Errorf("block time %v, want the header's %v (not the failed node's)", got, want)
	}
	// The next node's log without an address is refused, whatever came before.
	noAddress := answeringNode(t, "["+transferLog(100, 0, txHash(1), `"address":"-"`)+"]", 0, "[]")
	if _, err := sourceOn(t, answeringNode(t, "["+forged+","+broken+"]", 0, "[]"), noAddress).ScanWithHashes(ctx, 100, 100, nil); err == nil ||
		!strings.Contains(err.Error(), "without its address") {
		t.Errorf("a log without an address after a failed node: %v, want it refused", err)
	}
}

// A node (or a relay in front of it) that answers eth_getLogs with logs of
// other blocks than those asked for is not believed: the next node is
// asked. Believed, a log of a later block would have moved the cursor past
// blocks nobody read.
func TestScanRefusesLogsOutsideTheRange(t *testing.T) {
	ctx := context.Background()
	stray := answeringNode(t, "["+transferLog(112, 0, txHash(3))+"]", 0, "[]")
	if _, err := sourceOn(t, stray).ScanWithHashes(ctx, 100, 110, nil); err == nil || !strings.Contains(err.Error(), "a log of block 112") {
		t.Fatalf("a log of block 112 for blocks 100-110: %v, want it refused", err)
	}
	honest := answeringNode(t, "["+transferLog(105, 0, txHash(4))+"]", 0, "[]")
	b, err := sourceOn(t, stray, honest).ScanWithHashes(ctx, 100, 110, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Transfers) != 1 || b.Transfers[0].BlockNumber != 105 {
		t.Fatalf("%+v, want the honest node's transfer in block 105", b.Transfers)
	}
}

// A customer's tx hash looked up: a receipt whose log is malformed (null
// where a mined log has a value), or of another block than the receipt's,
// is that node's failure; the next node's whole answer is taken, never
// part of one.
func TestLookupTxTakesNoPartOfAMalformedReceipt(t *testing.T) {
	ctx := context.Background()
	two := func(first string) string {
		return "[" + first + "," + transferLog(100, 1, txHash(1)) + "]"
	}
	honest := answeringNode(t, "[]", 100, two(transferLog(100, 0, txHash(1))))
	for name, bad := range map[string]string{
		"a null block number":  two(transferLog(100, 0, txHash(1), `"blockNumber":null`)),
		"a null index":         two(transferLog(100, 0, txHash(1), `"logIndex":null`)),
		"a log of block 99":    two(transferLog(99, 0, txHash(1))),
		"a log without a hash": two(transferLog(100, 0, txHash(1), `"blockHash":"-"`)),
		"another tx's log":     two(transferLog(100, 0, txHash(2))),
		// Decoding stops at the bad field: the logs before it must not be
		// taken as the whole receipt.
		"an undecodable time": two(transferLog(100, 0, txHash(1), `"blockTimestamp":"0xzz"`)),
	} {
		liar := answeringNode(t, "[]", 100, bad)
		if found, err := sourceOn(t, liar).LookupTx(ctx, txHash(1)); err == nil {
			t.Errorf("%s: %d found, want the answer refused", name, len(found))
		}
		found, err := sourceOn(t, liar, honest).LookupTx(ctx, txHash(1))
		if err != nil || len(found) != 2 {
			t.Errorf("%s, then an honest node: %d found (%v), want the honest node's 2", name, len(found), err)
		}
	}
	// A refused receipt's fields do not stay in the next node's: its forged
	// block time is not the honest block's.
	forged := answeringNode(t, "[]", 100,
		"["+transferLog(100, 0, txHash(1), `"blockTimestamp":"0x1"`)+","+transferLog(99, 1, txHash(1))+"]")
	found, err := sourceOn(t, forged, honest).LookupTx(ctx, txHash(1))
	if err != nil || len(found) != 2 {
		t.Fatalf("a forged receipt, then an honest node: %d found (%v), want 2", len(found), err)
	}
	if want := time.Unix(1_690_000_100, 0).UTC(); !found[0].BlockTime.Equal(want) {
		t.Errorf("block time %v, want the honest block's %v (not the refused node's)", found[0].BlockTime, want)
	}
}
