// Package evmtest runs go-ethereum's simulated backend behind a real HTTP
// JSON-RPC endpoint, with the project's test token deployed, for tests of
// everything that watches EVM chains. It is imported by tests only.
package evmtest

import (
	"context"
	"crypto/ecdsa"
	_ "embed"
	"fmt"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/rawdb"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/eth/ethconfig"
	"github.com/ethereum/go-ethereum/ethclient/simulated"
	"github.com/ethereum/go-ethereum/node"
)

//go:embed contracts/Token.abi
var tokenABIJSON string

//go:embed contracts/Token.bin
var tokenBin string

// TokenABI is the parsed ABI of the test token.
var TokenABI = func() abi.ABI {
	a, err := abi.JSON(strings.NewReader(tokenABIJSON))
	if err != nil {
		panic(err)
	}
	return a
}()

// ChainID is the simulated backend's chain id.
const ChainID = 1337

// Chain is a simulated EVM chain with an HTTP endpoint and funded accounts.
type Chain struct {
	t       testing.TB
	Backend *simulated.Backend
	Client  simulated.Client
	// URL is the HTTP JSON-RPC endpoint.
	URL string
	// Payer is a funded account that tests pay from; Keys holds more.
	Payer *ecdsa.PrivateKey
	Keys  []*ecdsa.PrivateKey

	mu     sync.Mutex
	nonces map[common.Address]uint64
}

// Address returns the address of a key.
func Address(k *ecdsa.PrivateKey) common.Address { return crypto.PubkeyToAddress(k.PublicKey) }

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Option changes how New sets up the chain.
type Option func(*ethconfig.Config)

// Pruned keeps only recent state, as most full nodes do: calls against
// blocks older than ~128 fail with "historical state is not available".
func Pruned() Option {
	return func(ec *ethconfig.Config) { ec.NoPruning, ec.StateScheme = false, rawdb.PathScheme }
}

// New starts a simulated chain with funded accounts and an HTTP endpoint;
// it keeps all historical state unless told otherwise, and stops when t
// ends.
func New(t testing.TB, opts ...Option) *Chain {
	t.Helper()
	c := &Chain{t: t, nonces: map[common.Address]uint64{}}
	alloc := types.GenesisAlloc{}
	for i := 0; i < 4; i++ {
		k, err := crypto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		c.Keys = append(c.Keys, k)
		alloc[Address(k)] = types.Account{Balance: new(big.Int).Mul(big.NewInt(1_000_000), big.NewInt(1e18))}
	}
	c.Payer = c.Keys[0]
	port := freePort(t)
	c.Backend = simulated.NewBackend(alloc, func(nc *node.Config, ec *ethconfig.Config) {
		nc.HTTPHost = "127.0.0.1"
		nc.HTTPPort = port
		nc.HTTPModules = []string{"eth", "net", "web3"}
		ec.NoPruning = true // keep historical state: balances at old blocks
		ec.StateScheme = rawdb.HashScheme
		for _, o := range opts {
			o(ec)
		}
		ec.LogNoHistory = false // index logs as a real node does
	})
	t.Cleanup(func() { c.Backend.Close() })
	c.Client = c.Backend.Client()
	c.URL = fmt.Sprintf("http://127.0.0.1:%d", port)
	return c
}

func (c *Chain) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c.t.Cleanup(cancel)
	return ctx
}

// Head returns the current block number.
func (c *Chain) Head() uint64 {
	n, err := c.Client.BlockNumber(c.ctx())
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// Mine seals n blocks and returns the hash of the last.
func (c *Chain) Mine(n int) common.Hash {
	var h common.Hash
	for i := 0; i < n; i++ {
		h = c.Backend.Commit()
	}
	return h
}

// HashAt returns the canonical hash at height n.
func (c *Chain) HashAt(n uint64) common.Hash {
	h, err := c.Client.HeaderByNumber(c.ctx(), new(big.Int).SetUint64(n))
	if err != nil {
		c.t.Fatal(err)
	}
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
	c.mu.Lock()
	c.nonces = map[common.Address]uint64{} // re-read from the new chain
	c.mu.Unlock()
	if between != nil {
		between()
	}
	c.Mine(depth + extra)
	if got := c.Head(); got != head+uint64(extra) {
		c.t.Fatalf("after reorg head is %d, want %d", got, head+uint64(extra))
	}
}

func (c *Chain) nonce(from common.Address) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nonces[from]
	if !ok {
		var err error
		n, err = c.Client.PendingNonceAt(c.ctx(), from)
		if err != nil {
			c.t.Fatal(err)
		}
	}
	c.nonces[from] = n + 1
	return n
}

// Send signs and submits a transaction; it is mined by the next Mine.
func (c *Chain) Send(from *ecdsa.PrivateKey, to *common.Address, value *big.Int, data []byte, gas uint64) common.Hash {
	c.t.Helper()
	tx := types.NewTx(&types.DynamicFeeTx{
		ChainID: big.NewInt(ChainID), Nonce: c.nonce(Address(from)), GasTipCap: big.NewInt(1e9),
		GasFeeCap: big.NewInt(100e9), Gas: gas, To: to, Value: value, Data: data,
	})
	signed, err := types.SignTx(tx, types.LatestSignerForChainID(big.NewInt(ChainID)), from)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := c.Client.SendTransaction(c.ctx(), signed); err != nil {
		c.t.Fatalf("send: %v", err)
	}
	return signed.Hash()
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
	Address  common.Address
	Decimals uint8
}

// DeployToken deploys the test token, mines it, and mints a large balance
// to every funded key.
func (c *Chain) DeployToken(name, symbol string, decimals uint8) *Token {
	c.t.Helper()
	args, err := TokenABI.Pack("", name, symbol, decimals)
	if err != nil {
		c.t.Fatal(err)
	}
	code := append(common.FromHex(strings.TrimSpace(tokenBin)), args...)
	hash := c.Send(c.Payer, nil, nil, code, 3_000_000)
	c.Mine(1)
	r := c.Receipt(hash)
	if r.Status != types.ReceiptStatusSuccessful {
		c.t.Fatal("token deployment failed")
	}
	tok := &Token{c: c, Address: r.ContractAddress, Decimals: decimals}
	supply := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(decimals)+12), nil)
	for _, k := range c.Keys {
		tok.call(c.Payer, "mint", Address(k), supply)
	}
	c.Mine(1)
	return tok
}

func (tok *Token) call(from *ecdsa.PrivateKey, method string, args ...any) common.Hash {
	tok.c.t.Helper()
	data, err := TokenABI.Pack(method, args...)
	if err != nil {
		tok.c.t.Fatal(err)
	}
	return tok.c.Send(from, &tok.Address, nil, data, 1_000_000)
}

// Transfer sends value base units from a key to an address.
func (tok *Token) Transfer(from *ecdsa.PrivateKey, to common.Address, value *big.Int) common.Hash {
	return tok.call(from, "transfer", to, value)
}

// BatchTransfer makes several transfers in one transaction.
func (tok *Token) BatchTransfer(from *ecdsa.PrivateKey, to []common.Address, values []*big.Int) common.Hash {
	data, err := TokenABI.Pack("batchTransfer", to, values)
	if err != nil {
		tok.c.t.Fatal(err)
	}
	return tok.c.Send(from, &tok.Address, nil, data, uint64(100_000+60_000*len(to)))
}

// FakeTransfer emits a Transfer event without moving any balance.
func (tok *Token) FakeTransfer(from *ecdsa.PrivateKey, to common.Address, value *big.Int) common.Hash {
	return tok.call(from, "fakeTransfer", to, value)
}

// TransferThenRevert makes a transaction that transfers and then reverts.
func (tok *Token) TransferThenRevert(from *ecdsa.PrivateKey, to common.Address, value *big.Int) common.Hash {
	return tok.call(from, "transferThenRevert", to, value)
}
