// Package evmtest runs the development chain (package devchain: go-ethereum's
// simulated backend behind a real HTTP JSON-RPC endpoint, with the
// project's token contract) for tests of everything that watches EVM
// chains, failing the test on any error. It is imported by tests only.
package evmtest

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/ethclient/simulated"

	"github.com/paywatch/paywatch/chains/evm/devchain"
)

// TokenABI is the parsed ABI of the test token.
var TokenABI = func() abi.ABI {
	a, err := devchain.TokenABI()
	if err != nil {
		panic(err)
	}
	return a
}()

// ChainID is the simulated backend's chain id.
const ChainID = devchain.ChainID

// Chain is a simulated EVM chain with an HTTP endpoint and funded accounts.
type Chain struct {
	t     testing.TB
	chain *devchain.Chain
	// Backend and Client reach the simulated backend directly.
	Backend *simulated.Backend
	Client  simulated.Client
	// URL is the HTTP JSON-RPC endpoint.
	URL string
	// Payer is a funded account that tests pay from; Keys holds more.
	Payer *ecdsa.PrivateKey
	Keys  []*ecdsa.PrivateKey
}

// Address returns the address of a key.
func Address(k *ecdsa.PrivateKey) common.Address { return devchain.Address(k) }

// Option changes how New sets up the chain.
type Option func(*devchain.Config)

// Pruned keeps only recent state, as most full nodes do: calls against
// blocks older than ~128 fail with "historical state is not available".
func Pruned() Option {
	return func(c *devchain.Config) { c.Pruned = true }
}

// IndexedLogs builds the node's log index in the background, as a
// production node does (see devchain.Config.IndexLogs).
func IndexedLogs() Option {
	return func(c *devchain.Config) { c.IndexLogs = true }
}

// New starts a simulated chain with funded accounts and an HTTP endpoint;
// it keeps all historical state unless told otherwise, and stops when t
// ends.
func New(t testing.TB, opts ...Option) *Chain {
	t.Helper()
	var cfg devchain.Config
	for _, o := range opts {
		o(&cfg)
	}
	dc, err := devchain.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	return &Chain{t: t, chain: dc, Backend: dc.Backend, Client: dc.Client, URL: dc.URL, Payer: dc.Keys[0], Keys: dc.Keys}
}

func (c *Chain) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c.t.Cleanup(cancel)
	return ctx
}

func (c *Chain) must(err error) {
	if err != nil {
		c.t.Helper()
		c.t.Fatal(err)
	}
}

// Head returns the current block number.
func (c *Chain) Head() uint64 {
	n, err := c.chain.Head(c.ctx())
	c.must(err)
	return n
}

// Mine seals n blocks and returns the hash of the last.
func (c *Chain) Mine(n int) common.Hash { return c.chain.Mine(n) }

// HashAt returns the canonical hash at height n.
func (c *Chain) HashAt(n uint64) common.Hash {
	h, err := c.Client.HeaderByNumber(c.ctx(), new(big.Int).SetUint64(n))
	c.must(err)
	return h.Hash()
}

// Reorg replaces the last depth blocks with a longer side chain of
// depth+extra blocks. Pending and dropped transactions are discarded unless
// keepTxs is set, in which case they are mined again in the new chain.
// between runs after the fork, before the new blocks are sealed (send
// transactions there to put them in the new chain's first block).
func (c *Chain) Reorg(depth, extra int, keepTxs bool, between func()) {
	c.t.Helper()
	head := c.Head()
	parent := c.HashAt(head - uint64(depth))
	if err := c.Backend.Fork(parent); err != nil {
		c.t.Fatalf("fork at %d: %v", head-uint64(depth), err)
	}
	if !keepTxs {
		c.Backend.Rollback()
	}
	c.chain.ForgetNonces() // re-read from the new chain
	if between != nil {
		between()
	}
	c.Mine(depth + extra)
	if got := c.Head(); got != head+uint64(extra) {
		c.t.Fatalf("after reorg head is %d, want %d", got, head+uint64(extra))
	}
}

// Send signs and submits a transaction; it is mined by the next Mine.
func (c *Chain) Send(from *ecdsa.PrivateKey, to *common.Address, value *big.Int, data []byte, gas uint64) common.Hash {
	c.t.Helper()
	h, err := c.chain.Send(c.ctx(), from, to, value, data, gas)
	c.must(err)
	return h
}

// SendETH sends native coin.
func (c *Chain) SendETH(from *ecdsa.PrivateKey, to common.Address, wei *big.Int) common.Hash {
	return c.Send(from, &to, wei, nil, 21000)
}

// Receipt returns the receipt of a mined transaction.
func (c *Chain) Receipt(tx common.Hash) *types.Receipt {
	r, err := c.Client.TransactionReceipt(c.ctx(), tx)
	if err != nil {
		c.t.Fatalf("receipt of %s: %v", tx, err)
	}
	return r
}

// Token is a deployed test token.
type Token struct {
	c        *Chain
	tok      *devchain.Token
	Address  common.Address
	Decimals uint8
}

// DeployToken deploys the test token, mines it, and mints a large balance
// to every funded key.
func (c *Chain) DeployToken(name, symbol string, decimals uint8) *Token {
	c.t.Helper()
	tok, err := c.chain.DeployToken(c.ctx(), name, symbol, decimals)
	c.must(err)
	return &Token{c: c, tok: tok, Address: tok.Address, Decimals: decimals}
}

func (tok *Token) call(from *ecdsa.PrivateKey, gas uint64, method string, args ...any) common.Hash {
	tok.c.t.Helper()
	h, err := tok.tok.CallWithGas(tok.c.ctx(), from, gas, method, args...)
	tok.c.must(err)
	return h
}

// Transfer sends value base units from a key to an address.
func (tok *Token) Transfer(from *ecdsa.PrivateKey, to common.Address, value *big.Int) common.Hash {
	return tok.call(from, 1_000_000, "transfer", to, value)
}

// BatchTransfer makes several transfers in one transaction.
func (tok *Token) BatchTransfer(from *ecdsa.PrivateKey, to []common.Address, values []*big.Int) common.Hash {
	return tok.call(from, uint64(100_000+60_000*len(to)), "batchTransfer", to, values)
}

// FakeTransfer emits a Transfer event without moving any balance.
func (tok *Token) FakeTransfer(from *ecdsa.PrivateKey, to common.Address, value *big.Int) common.Hash {
	return tok.call(from, 1_000_000, "fakeTransfer", to, value)
}

// TransferThenRevert makes a transaction that transfers and then reverts.
func (tok *Token) TransferThenRevert(from *ecdsa.PrivateKey, to common.Address, value *big.Int) common.Hash {
	return tok.call(from, 1_000_000, "transferThenRevert", to, value)
}
