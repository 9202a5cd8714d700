package evm

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/core/types"
)

// aLog is one Transfer log as a node answers it, with the fields named in
// drop left out.
func aLog(i int, drop ...string) string {
	fields := map[string]string{
		"address": `"0x5fbdb2315678afecb367f032d93f642f64180aa3"`,
		"topics": `["0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef",` +
			`"0x000000000000000000000000f39fd6e51aad88f6f4ce6ab8827279cfffb92266",` +
			`"0x00000000000000000000000070997970c51812dc3a010c7d01b50e0d17dc79c8"]`,
		"data":             `"0x00000000000000000000000000000000000000000000000000000000000f4240"`,
		"blockNumber":      fmt.Sprintf(`"0x%x"`, 1000+i),
		"transactionHash":  fmt.Sprintf(`"0x%064x"`, i+1),
		"transactionIndex": fmt.Sprintf(`"0x%x"`, i%7),
		"blockHash":        fmt.Sprintf(`"0x%064x"`, 1000+i),
		"blockTimestamp":   `"0x6543a1b2"`,
		"logIndex":         fmt.Sprintf(`"0x%x"`, i),
		"removed":          fmt.Sprint(i%5 == 4),
	}
	var parts []string
	for _, k := range []string{"address", "topics", "data", "blockNumber", "transactionHash", "transactionIndex",
		"blockHash", "blockTimestamp", "logIndex", "removed"} {
		if !strings.Contains(" "+strings.Join(drop, " ")+" ", " "+k+" ") {
			parts = append(parts, `"`+k+`":`+fields[k])
		}
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func logList(n int) []byte {
	logs := make([]string, n)
	for i := range logs {
		logs[i] = aLog(i)
	}
	return []byte("[" + strings.Join(logs, ",") + "]")
}

// wireDecode decodes data as the scanner does.
func wireDecode(data []byte) ([]types.Log, error) {
	var ws []wireLog
	if err := json.Unmarshal(data, &ws); err != nil {
		return nil, err
	}
	return decodeLogs(ws)
}

func TestDecodeLogsReadsWhatTypesLogReads(t *testing.T) {
	for _, data := range [][]byte{
		logList(0), logList(1), logList(7),
		[]byte("[" + aLog(3, "blockTimestamp", "transactionIndex", "removed") + "]"),
		[]byte("[" + nulled(aLog(4), "blockTimestamp", "transactionIndex") + "]"),
		[]byte(`[{"address":"0x5fbdb2315678afecb367f032d93f642f64180aa3","topics":[],"data":"0x","transactionHash":"0x` +
			strings.Repeat("ab", 32) + `","blockNumber":"0x1","blockHash":"0x` + strings.Repeat("cd", 32) + `","logIndex":"0x0"}]`),
	} {
		want, err := decodeTypesLogs(data)
		if err != nil {
			t.Fatalf("types.Log refused %s: %v", data, err)
		}
		got, err := wireDecode(data)
		if err != nil {
			t.Fatalf("refused %s: %v", data, err)
		}
		if len(want) == 0 && len(got) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %+v\nwant %+v", data, got, want)
		}
	}
}

// A log without what every mined log has, or with it null, is refused:
// types.Log refuses the first four too, and would read the last three as
// block 0, a zero hash and index 0.
func TestDecodeLogsRefusesALogWithoutWhatEveryLogHas(t *testing.T) {
	for _, field := range []string{"address", "topics", "data", "transactionHash", "blockNumber", "blockHash", "logIndex"} {
		data := []byte("[" + aLog(0) + "," + aLog(1, field) + "]")
		if _, err := wireDecode(data); err == nil {
			t.Errorf("a log without %s was taken", field)
		}
		if _, err := wireDecode([]byte("[" + nulled(aLog(0), field) + "]")); err == nil {
			t.Errorf("a log with a null %s was taken", field)
		}
	}
	for _, field := range []string{"address", "topics", "data", "transactionHash"} {
		if _, err := decodeTypesLogs([]byte("[" + aLog(1, field) + "]")); err == nil {
			t.Errorf("types.Log took a log without %s: the two no longer agree", field)
		}
	}
}

// nulled is the log with the fields named made null.
func nulled(log string, fields ...string) string {
	for _, f := range fields {
		log = strings.Replace(log, `"`+f+`":`, `"`+f+`":null,"was":`, 1)
	}
	return log
}

func decodeTypesLogs(data []byte) ([]types.Log, error) {
	var logs []types.Log
	err := json.Unmarshal(data, &logs)
	return logs, err
}

// FuzzDecodeLogs: whatever a node answers, a list the scanner takes is one
// types.Log takes too, read the same.
func FuzzDecodeLogs(f *testing.F) {
	f.Add(logList(2))
	f.Add([]byte("[" + aLog(1, "data") + "]"))
	f.Add([]byte(`[{"address":null}]`))
	f.Add([]byte(`[{"topics":[null],"removed":true}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := wireDecode(data)
		if err != nil {
			return
		}
		want, err := decodeTypesLogs(data)
		if err != nil {
			t.Fatalf("taken here, refused by types.Log (%v): %q", err, data)
		}
		if len(want) == 0 && len(got) == 0 {
			return
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n got %+v\nwant %+v", data, got, want)
		}
	})
}

// BenchmarkDecodeLogs decodes an eth_getLogs answer of 400 Transfer logs as
// the scanner does, beside types.Log's own decoding of the same. Run:
//
//	go test -run '^$' -bench BenchmarkDecodeLogs -benchmem ./chains/evm/
func BenchmarkDecodeLogs(b *testing.B) {
	data := logList(400)
	b.Run("types.Log", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeTypesLogs(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("paywatch", func(b *testing.B) {
		for b.Loop() {
			if _, err := wireDecode(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
