// Package devchain runs an EVM development chain in-process: go-ethereum's
// simulated backend behind a real HTTP JSON-RPC endpoint, funded accounts,
// and paywatch's token contract (contracts/Token.sol, compiled and shipped
// beside it). `paywatch dev` and the tests use it; the daemon (`serve`)
// never imports it.
package devchain

import (
	"context"
	"crypto/ecdsa"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net"
	"strings"
	"sync"
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

// TokenABI parses the token's ABI.
func TokenABI() (abi.ABI, error) { return abi.JSON(strings.NewReader(tokenABIJSON)) }

// ChainID is the development chain's id.
const ChainID = 1337

// Chain is a development chain with an HTTP endpoint and funded accounts.
type Chain struct {
	Backend *simulated.Backend
	Client  simulated.Client
	// URL is the HTTP JSON-RPC endpoint.
	URL string
	// Keys are funded accounts (a million coins each).
	Keys []*ecdsa.PrivateKey

	token  abi.ABI
	mu     sync.Mutex
	nonces map[common.Address]uint64
}

// Address returns the address of a key.
func Address(k *ecdsa.PrivateKey) common.Address { return crypto.PubkeyToAddress(k.PublicKey) }

// Config tells New how to set the chain up.
type Config struct {
	// Keys are the accounts to fund; New generates four when empty.
	Keys []*ecdsa.PrivateKey
	// Listen is the JSON-RPC address ("127.0.0.1:0" when empty: a free
	// port).
	Listen string
	// Pruned keeps only recent state, as most full nodes do: calls against
	// blocks older than ~128 fail with "historical state is not available".
	Pruned bool
	// IndexLogs builds the node's log index, as a production node does.
	// It is built in the background: a log query racing its update may
	// fail ("failed to retrieve log value pointer"), as a lagging node's
	// would. Off by default (go-ethereum's own default for this backend):
	// logs are then searched block by block, which never races.
	IndexLogs bool
	// DataDir keeps the chain on disk in this directory, as a node a shop
	// runs keeps it, instead of in memory. A long chain wants it: once
	// blocks are final, go-ethereum moves them out of the key-value store,
	// and over the in-memory store each block moved costs a scan of every
	// key (10,000 blocks keep both cores busy for minutes).
	DataDir string
}

// New starts a chain; Close stops it.
func New(cfg Config) (*Chain, error) {
	token, err := TokenABI()
	if err != nil {
		return nil, err
	}
	c := &Chain{nonces: map[common.Address]uint64{}, Keys: cfg.Keys, token: token}
	for len(c.Keys) < 4 {
		k, err := crypto.GenerateKey()
		if err != nil {
			return nil, err
		}
		c.Keys = append(c.Keys, k)
	}
	alloc := types.GenesisAlloc{}
	for _, k := range c.Keys {
		alloc[Address(k)] = types.Account{Balance: new(big.Int).Mul(big.NewInt(1_000_000), big.NewInt(1e18))}
	}
	listen := cfg.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	host, port, err := freeAddr(listen)
	if err != nil {
		return nil, err
	}
	c.Backend = simulated.NewBackend(alloc, func(nc *node.Config, ec *ethconfig.Config) {
		nc.HTTPHost = host
		nc.HTTPPort = port
		nc.HTTPModules = []string{"eth", "net", "web3"}
		nc.DataDir = cfg.DataDir
		ec.NoPruning = true // keep historical state: balances at old blocks
		ec.StateScheme = rawdb.HashScheme
		if cfg.Pruned {
			ec.NoPruning, ec.StateScheme = false, rawdb.PathScheme
		}
		ec.LogNoHistory = !cfg.IndexLogs
	})
	c.Client = c.Backend.Client()
	c.URL = fmt.Sprintf("http://%s", net.JoinHostPort(host, fmt.Sprint(port)))
	return c, nil
}

// freeAddr resolves a listen address with port 0 to a free port.
func freeAddr(listen string) (string, int, error) {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return "", 0, fmt.Errorf("development chain: %w", err)
	}
	defer l.Close()
	a := l.Addr().(*net.TCPAddr)
	return a.IP.String(), a.Port, nil
}

// Close stops the chain.
func (c *Chain) Close() error { return c.Backend.Close() }

// Head returns the current block number.
func (c *Chain) Head(ctx context.Context) (uint64, error) { return c.Client.BlockNumber(ctx) }

// Mine seals n blocks and returns the hash of the last.
func (c *Chain) Mine(n int) common.Hash {
	c.waitForPool()
	var h common.Hash
	for range n {
		h = c.Backend.Commit()
	}
	return h
}

// waitForPool waits, up to a second, until the pool holds every
// transaction Send handed over as ready to mine: it takes them in the
// background, and a block made before would leave the last ones out.
func (c *Chain) waitForPool() {
	c.mu.Lock()
	sent := maps.Clone(c.nonces)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for from, next := range sent {
		for {
			pending, err := c.Client.PendingNonceAt(ctx, from)
			if err != nil || pending >= next || ctx.Err() != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// ForgetNonces makes the next sends read nonces from the chain again
// (after a reorg).
func (c *Chain) ForgetNonces() {
	c.mu.Lock()
	c.nonces = map[common.Address]uint64{}
	c.mu.Unlock()
}

func (c *Chain) nonce(ctx context.Context, from common.Address) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nonces[from]
	if !ok {
		var err error
		if n, err = c.Client.PendingNonceAt(ctx, from); err != nil {
			return 0, err
		}
	}
	c.nonces[from] = n + 1
	return n, nil
}

// Send signs and submits a transaction; the next block mines it.
func (c *Chain) Send(ctx context.Context, from *ecdsa.PrivateKey, to *common.Address, value *big.Int, data []byte, gas uint64) (common.Hash, error) {
	n, err := c.nonce(ctx, Address(from))
	if err != nil {
		return common.Hash{}, err
	}
	tx := types.NewTx(&types.DynamicFeeTx{
		ChainID: big.NewInt(ChainID), Nonce: n, GasTipCap: big.NewInt(1e9),
		GasFeeCap: big.NewInt(100e9), Gas: gas, To: to, Value: value, Data: data,
	})
	signed, err := types.SignTx(tx, types.LatestSignerForChainID(big.NewInt(ChainID)), from)
	if err != nil {
		return common.Hash{}, err
	}
	if err := c.Client.SendTransaction(ctx, signed); err != nil {
		return common.Hash{}, fmt.Errorf("send: %w", err)
	}
	return signed.Hash(), nil
}

// Token is a deployed token contract.
type Token struct {
	c        *Chain
	Address  common.Address
	Decimals uint8
}

// DeployToken deploys the token, mines it, and mints a trillion whole
// tokens to every funded key.
func (c *Chain) DeployToken(ctx context.Context, name, symbol string, decimals uint8) (*Token, error) {
	args, err := c.token.Pack("", name, symbol, decimals)
	if err != nil {
		return nil, err
	}
	code := append(common.FromHex(strings.TrimSpace(tokenBin)), args...)
	hash, err := c.Send(ctx, c.Keys[0], nil, nil, code, 3_000_000)
	if err != nil {
		return nil, err
	}
	c.Mine(1)
	r, err := c.Client.TransactionReceipt(ctx, hash)
	if err != nil {
		return nil, fmt.Errorf("receipt of the token deployment: %w", err)
	}
	if r.Status != types.ReceiptStatusSuccessful {
		return nil, errors.New("token deployment failed")
	}
	tok := &Token{c: c, Address: r.ContractAddress, Decimals: decimals}
	supply := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(decimals)+12), nil)
	for _, k := range c.Keys {
		if _, err := tok.Call(ctx, c.Keys[0], "mint", Address(k), supply); err != nil {
			return nil, err
		}
	}
	c.Mine(1)
	return tok, nil
}

// Call sends a transaction calling method on the token, with a million
// gas.
func (tok *Token) Call(ctx context.Context, from *ecdsa.PrivateKey, method string, args ...any) (common.Hash, error) {
	return tok.CallWithGas(ctx, from, 1_000_000, method, args...)
}

// CallWithGas is Call with the gas limit given.
func (tok *Token) CallWithGas(ctx context.Context, from *ecdsa.PrivateKey, gas uint64, method string, args ...any) (common.Hash, error) {
	data, err := tok.c.token.Pack(method, args...)
	if err != nil {
		return common.Hash{}, err
	}
	return tok.c.Send(ctx, from, &tok.Address, nil, data, gas)
}

// TransferData is the calldata of a token transfer of value base units to
// an address: what a wallet sends to the token's contract.
func TransferData(to common.Address, value *big.Int) ([]byte, error) {
	a, err := TokenABI()
	if err != nil {
		return nil, err
	}
	return a.Pack("transfer", to, value)
}
