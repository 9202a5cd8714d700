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
// The fields every log has are required, as types.Log requires them; the
// others may be absent, but not null: a mined log always has its block
// number, block hash and index, and a node that answers null for one is
// not believed (types.Log would take it for block 0).
type wireLog struct {
	Address        *common.Address `json:"address"`
	Topics         []common.Hash   `json:"topics"`
	Data           hexutil.Bytes   `json:"data"`
	BlockNumber    hexutil.Uint64  `json:"blockNumber"`
	TxHash         *common.Hash    `json:"transactionHash"`
	TxIndex        hexutil.Uint    `json:"transactionIndex"`
	BlockHash      common.Hash     `json:"blockHash"`
	BlockTimestamp hexutil.Uint64  `json:"blockTimestamp"`
	Index          hexutil.Uint    `json:"logIndex"`
	Removed        bool            `json:"removed"`
}

// decodeLogs turns logs as read into types.Log, refusing one without the
// fields every log has (a node that leaves them out is not believed).
func decodeLogs(ws []wireLog) ([]types.Log, error) {
	logs := make([]types.Log, len(ws))
	for i, w := range ws {
		switch {
		case w.Address == nil:
			return nil, errors.New("a log without its address")
		case w.Topics == nil:
			return nil, errors.New("a log without its topics")
		case w.Data == nil:
			return nil, errors.New("a log without its data")
		case w.TxHash == nil:
			return nil, errors.New("a log without its transaction hash")
		}
		logs[i] = types.Log{Address: *w.Address, Topics: w.Topics, Data: w.Data, BlockNumber: uint64(w.BlockNumber),
			TxHash: *w.TxHash, TxIndex: uint(w.TxIndex), BlockHash: w.BlockHash, BlockTimestamp: uint64(w.BlockTimestamp), Index: uint(w.Index),
			Removed: w.Removed}
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
