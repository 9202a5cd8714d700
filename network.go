package paywatch

import (
	"math/big"
	"time"
)

// Family is a kind of chain that one adapter package knows how to watch.
type Family string

// The chain families paywatch watches.
const (
	FamilyEVM     Family = "evm"
	FamilyBitcoin Family = "bitcoin"
)

// BlockTimeSlack is how long before an order's creation a block's own
// timestamp may be, its transfers still paying the order. The block height
// the network had reached when the order was created decides first; this
// bounds the case where that height was recorded late (a lagging node).
// Bitcoin block times may be an hour or two off the wall clock.
func (f Family) BlockTimeSlack() time.Duration {
	if f == FamilyBitcoin {
		return 2 * time.Hour
	}
	return 5 * time.Minute
}

// Network is one configured chain.
type Network struct {
	Name    string
	Family  Family
	RPCURLs []string
	// RPCUser and RPCPass authenticate to a Bitcoin node; empty for EVM.
	RPCUser, RPCPass string
	// RPCCookieFile is Bitcoin Core's cookie file (instead of a user and
	// password); RPCCertFile a certificate to trust for https node URLs
	// (btcd's own).
	RPCCookieFile, RPCCertFile string
	ChainID                    uint64 // EVM only
	Chain                      string // Bitcoin only: mainnet, testnet, signet, regtest, simnet
	// Confirmations is the number of blocks (the transfer's own included)
	// that make a transfer confirmed. UseFinalized replaces it with the
	// node's finalized block tag.
	Confirmations int
	UseFinalized  bool
	PollInterval  time.Duration
	// StartBlock is where scanning begins on first start; StartLatest asks
	// for the head at that moment instead.
	StartBlock  uint64
	StartLatest bool
	Assets      []*Asset
}

// Asset returns the network's asset with the given symbol, or nil.
func (n *Network) Asset(symbol string) *Asset {
	for _, a := range n.Assets {
		if a.Symbol == symbol {
			return a
		}
	}
	return nil
}

// AddressMode tells how an asset's receiving addresses are chosen.
type AddressMode string

// The two receiving modes.
const (
	// ModeShared: several open orders pay to one of a few static addresses
	// and are told apart by a unique pay_amount.
	ModeShared AddressMode = "shared"
	// ModePerOrder: each order gets a fresh address derived from an
	// extended public key; pay_amount equals amount.
	ModePerOrder AddressMode = "per_order"
)

// Asset is a thing of value on one network: the native coin or a token
// identified by its contract address (never by its symbol).
type Asset struct {
	Network  string
	Symbol   string
	Native   bool
	Contract string // EVM token contract, checksummed; empty for native coins
	Decimals int32

	Mode AddressMode
	// Addresses are the shared receiving addresses (ModeShared).
	Addresses []string
	// UniqueStep is the increment between candidate pay amounts, in base
	// units, and UniqueSlots how many candidates there are (ModeShared).
	UniqueStep  *big.Int
	UniqueSlots int
	// XPub and ScriptType describe address derivation (ModePerOrder).
	XPub       string
	ScriptType string

	// GapLimit is how many derived addresses in a row may go unpaid before
	// the watcher warns: most wallets look no further (ModePerOrder).
	GapLimit int
	// SkipBalanceCheck turns off the fake-deposit guard of an EVM token (a
	// Transfer event counts only if the recipient's balance moved): for a
	// token the operator trusts (verify_balance: false).
	SkipBalanceCheck bool

	// MaxAmount bounds an order's amount, in base units.
	MaxAmount *big.Int
	// Dust is the smallest transfer, in base units, that may match an order.
	Dust *big.Int
}

// ParseAmount converts a decimal string in this asset's units to base units.
func (a *Asset) ParseAmount(s string) (*big.Int, error) {
	return ParseUnits(s, a.Decimals, a.Symbol, a.MaxAmount)
}

// FormatAmount renders base units of this asset as a decimal string.
func (a *Asset) FormatAmount(units *big.Int) string {
	return FormatUnits(units, a.Decimals)
}
