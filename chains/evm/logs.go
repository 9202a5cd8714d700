package evm

import (
	"errors"
	"fmt"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/core/types"
)

// wireLog is a log as eth_getLogs and receipts carry it. Decoding an
// answer's list into it takes one pass over the JSON: types.Log decodes
// itself, so a list of them is scanned twice more, log by log (400 logs:
// 4.1–4.8 ms and 7,615 allocations, against 2.0–2.6 ms and 2,418; see
// BenchmarkDecodeLogs). A catch-up that reads every Transfer log of a busy
// token spends most of its own CPU decoding them.
//
// What a mined log always has is required: its address, topics, data and
// transaction hash (as types.Log requires them), and its block number,
// block hash and index, which types.Log would read as block 0, a zero hash
// and index 0 when a node leaves them out. The transaction index and the
// block's timestamp may be absent or null (read as 0, as types.Log does).
type wireLog struct {
	Address        *common.Address `json:"address"`
	Topics         []common.Hash   `json:"topics"`
	Data           hexutil.Bytes   `json:"data"`
	BlockNumber    *hexutil.Uint64 `json:"blockNumber"`
	TxHash         *common.Hash    `json:"transactionHash"`
	TxIndex        *hexutil.Uint   `json:"transactionIndex"`
	BlockHash      *common.Hash    `json:"blockHash"`
	BlockTimestamp *hexutil.Uint64 `json:"blockTimestamp"`
	Index          *hexutil.Uint   `json:"logIndex"`
	Removed        bool            `json:"removed"`
}

// decodeLogs turns logs as read into types.Log, refusing one without what
// every mined log has (a node that leaves it out is not believed).
func decodeLogs(ws []wireLog) ([]types.Log, error) {
	logs := make([]types.Log, len(ws))
	for i, w := range ws {
		var missing string
		switch {
		case w.Address == nil:
			missing = "address"
		case w.Topics == nil:
			missing = "topics"
		case w.Data == nil:
			missing = "data"
		case w.TxHash == nil:
			missing = "transaction hash"
		case w.BlockNumber == nil:
			missing = "block number"
		case w.BlockHash == nil:
			missing = "block hash"
		case w.Index == nil:
			missing = "index"
		}
		if missing != "" {
			return nil, errors.New("a log without its " + missing)
		}
		l := types.Log{Address: *w.Address, Topics: w.Topics, Data: w.Data, BlockNumber: uint64(*w.BlockNumber),
			TxHash: *w.TxHash, BlockHash: *w.BlockHash, Index: uint(*w.Index), Removed: w.Removed}
		if w.TxIndex != nil {
			l.TxIndex = uint(*w.TxIndex)
		}
		if w.BlockTimestamp != nil {
			l.BlockTimestamp = uint64(*w.BlockTimestamp)
		}
		logs[i] = l
	}
	return logs, nil
}

// decodeLogLists is decodeLogs for the answers of several eth_getLogs.
func decodeLogLists(lists [][]wireLog) ([][]types.Log, error) {
	out := make([][]types.Log, len(lists))
	for i, ws := range lists {
		logs, err := decodeLogs(ws)
		if err != nil {
			return nil, fmt.Errorf("eth_getLogs: %w", err)
		}
		out[i] = logs
	}
	return out, nil
}
