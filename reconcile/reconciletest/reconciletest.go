// Package reconciletest holds what the tests of paywatch's money path
// share: a clock they move by hand, the networks and assets of their
// fixtures, and a chain in memory that the scanner can watch, with reorgs
// and node look-ups on demand.
package reconciletest

import (
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
)

// Clock is a time the test moves by hand; safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock standing at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t.UTC()} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// FirstSlot makes an orders.Store hand out the smallest free unique amount
// (its Rand), so that tests know pay amounts in advance.
func FirstSlot(int) int { return 0 }

// Fixture addresses and keys.
const (
	// VPub is a BIP84 test-chain account key (published test vectors'
	// mnemonic); orders on Bitcoin get addresses derived from it.
	VPub = "vpub5Y6cjg78GGuNLsaPhmYsiw4gYX3HoQiRBiSwDaBXKUafCt9bNwWQiitDk5VZ5BVxYnQdwoTyXSs2JHRPAgjAvtbBrf8ZhDYe2jWAqvZVnsc"
	// Shop is the shop's shared EVM receiving address.
	Shop = "0x1111111111111111111111111111111111111111"
	// USDTContract and DAIContract are the mainnet contracts of two tokens.
	USDTContract = "0xdAC17F958D2ee523a2206206994597C13D831ec7"
	DAIContract  = "0x6B175474E89094C44Da98b954EedeAC495271d0F"
)

// Fixtures are the networks and assets the money path's tests use: an EVM
// network with a token on the shop's shared address, and a Bitcoin network
// with an address per order.
type Fixtures struct {
	Ethereum *paywatch.Network
	USDT     *paywatch.Asset // 6 decimals, shared address Shop, 100 unique amounts a base unit apart
	DAI      *paywatch.Asset // 18 decimals, same address: another asset
	Bitcoin  *paywatch.Network
	BTC      *paywatch.Asset // 8 decimals, an address per order from VPub
}

// NewFixtures returns fresh fixtures; tests may change them.
func NewFixtures() *Fixtures {
	f := &Fixtures{
		Ethereum: &paywatch.Network{Name: "ethereum", Family: paywatch.FamilyEVM, Confirmations: 3},
		USDT: &paywatch.Asset{Network: "ethereum", Symbol: "USDT", Contract: USDTContract, Decimals: 6,
			Mode: paywatch.ModeShared, Addresses: []string{Shop}, UniqueStep: big.NewInt(1), UniqueSlots: 100},
		DAI:     &paywatch.Asset{Network: "ethereum", Symbol: "DAI", Contract: DAIContract, Decimals: 18},
		Bitcoin: &paywatch.Network{Name: "bitcoin", Family: paywatch.FamilyBitcoin, Chain: "regtest", Confirmations: 2},
		BTC: &paywatch.Asset{Network: "bitcoin", Symbol: "BTC", Native: true, Decimals: 8, Mode: paywatch.ModePerOrder,
			XPub: VPub},
	}
	f.Ethereum.Assets = []*paywatch.Asset{f.USDT, f.DAI}
	f.Bitcoin.Assets = []*paywatch.Asset{f.BTC}
	return f
}

// Network returns the fixture network an asset belongs to.
func (f *Fixtures) Network(a *paywatch.Asset) *paywatch.Network {
	if a.Network == f.Bitcoin.Name {
		return f.Bitcoin
	}
	return f.Ethereum
}

// Wallets derives the per-order addresses of VPub.
func Wallets(t testing.TB) bitcoin.Wallets {
	t.Helper()
	d, err := bitcoin.NewDeriver(VPub, "regtest", "")
	if err != nil {
		t.Fatal(err)
	}
	return bitcoin.Wallets{VPub: d}
}
