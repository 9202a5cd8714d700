// Package bitcoin watches Bitcoin networks (btcd or Bitcoin Core) and
// derives per-order receiving addresses from extended public keys.
package bitcoin

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/btcsuite/btcd/btcec/v2/schnorr"
	"github.com/btcsuite/btcd/btcutil"
	"github.com/btcsuite/btcd/btcutil/base58"
	"github.com/btcsuite/btcd/btcutil/hdkeychain"
	"github.com/btcsuite/btcd/chaincfg"
	"github.com/btcsuite/btcd/txscript"

	"github.com/paywatch/paywatch"
)

// Script types of derived addresses.
const (
	P2PKH      = "p2pkh"       // BIP44
	P2SHP2WPKH = "p2sh-p2wpkh" // BIP49
	P2WPKH     = "p2wpkh"      // BIP84
	P2TR       = "p2tr"        // BIP86
)

// ScriptTypes lists the script types a Deriver can produce.
var ScriptTypes = []string{P2PKH, P2SHP2WPKH, P2WPKH, P2TR}

// Params returns the chain parameters for a configured chain name.
func Params(chain string) (*chaincfg.Params, error) {
	switch chain {
	case "mainnet":
		return &chaincfg.MainNetParams, nil
	case "testnet":
		return &chaincfg.TestNet3Params, nil
	case "signet":
		return &chaincfg.SigNetParams, nil
	case "regtest":
		return &chaincfg.RegressionNetParams, nil
	case "simnet":
		return &chaincfg.SimNetParams, nil
	}
	return nil, fmt.Errorf("unknown bitcoin chain %q (want mainnet, testnet, signet, regtest or simnet)", chain)
}

// extendedKeyKind is what the version bytes of an extended public key say.
type extendedKeyKind struct {
	prefix  string
	mainnet bool
	script  string // default script type
}

var extendedKeyVersions = map[string]extendedKeyKind{
	"0488b21e": {"xpub", true, P2PKH},
	"049d7cb2": {"ypub", true, P2SHP2WPKH},
	"04b24746": {"zpub", true, P2WPKH},
	"043587cf": {"tpub", false, P2PKH},
	"044a5262": {"upub", false, P2SHP2WPKH},
	"045f1cf6": {"vpub", false, P2WPKH},
}

// Deriver derives receive addresses (external chain, m/0/i below the
// account key) from an account-level extended public key.
type Deriver struct {
	external *hdkeychain.ExtendedKey
	params   *chaincfg.Params
	script   string
}

// NewDeriver parses an extended public key for the given chain. scriptType
// may be empty to take the one the key's prefix implies (xpub/tpub: p2pkh,
// ypub/upub: p2sh-p2wpkh, zpub/vpub: p2wpkh); p2tr (BIP86) must be asked
// for, with an xpub or tpub.
func NewDeriver(key, chain, scriptType string) (*Deriver, error) {
	params, err := Params(chain)
	if err != nil {
		return nil, err
	}
	short := key
	if len(short) > 12 {
		short = short[:8] + "…"
	}
	raw := base58.Decode(key)
	if len(raw) != 82 {
		return nil, fmt.Errorf("extended key %s is malformed", short)
	}
	version := hex.EncodeToString(raw[:4])
	kind, ok := extendedKeyVersions[version]
	if !ok {
		if strings.Contains(key[:4], "prv") {
			return nil, fmt.Errorf("extended key %s is private; paywatch is watch-only and takes only public keys (xpub, ypub, zpub, tpub, upub, vpub)", short)
		}
		return nil, fmt.Errorf("extended key %s has unknown version bytes %s (want xpub, ypub, zpub, tpub, upub or vpub)", short, version)
	}
	parsed, err := hdkeychain.NewKeyFromString(key)
	if err != nil {
		return nil, fmt.Errorf("extended key %s is malformed: %v", short, err)
	}
	if parsed.IsPrivate() {
		return nil, fmt.Errorf("extended key %s is private; paywatch is watch-only", short)
	}
	isMainnet := params.Net == chaincfg.MainNetParams.Net
	if kind.mainnet != isMainnet {
		return nil, fmt.Errorf("extended key %s is a %s, which does not fit chain %q", short, kind.prefix, chain)
	}
	if scriptType == "" {
		scriptType = kind.script
	}
	switch scriptType {
	case P2PKH, P2TR:
		if kind.script != P2PKH {
			return nil, fmt.Errorf("script type %s does not fit a %s (use an xpub or tpub)", scriptType, kind.prefix)
		}
	case P2SHP2WPKH, P2WPKH:
		if kind.script != P2PKH && kind.script != scriptType {
			return nil, fmt.Errorf("script type %s does not fit a %s, which implies %s", scriptType, kind.prefix, kind.script)
		}
	default:
		return nil, fmt.Errorf("unknown script type %q (want %s)", scriptType, strings.Join(ScriptTypes, ", "))
	}
	external, err := parsed.Derive(0)
	if err != nil {
		return nil, fmt.Errorf("derive external chain of %s: %v", short, err)
	}
	return &Deriver{external: external, params: params, script: scriptType}, nil
}

// ScriptType is the script type of the addresses this Deriver makes.
func (d *Deriver) ScriptType() string { return d.script }

// Address returns the receive address at index i (path m/0/i below the
// account key).
func (d *Deriver) Address(i uint32) (string, error) {
	if i >= hdkeychain.HardenedKeyStart {
		return "", fmt.Errorf("derivation index %d is out of range", i)
	}
	child, err := d.external.Derive(i)
	if err != nil {
		return "", fmt.Errorf("derive index %d: %w", i, err)
	}
	pub, err := child.ECPubKey()
	if err != nil {
		return "", fmt.Errorf("derive index %d: %w", i, err)
	}
	var addr btcutil.Address
	hash := btcutil.Hash160(pub.SerializeCompressed())
	switch d.script {
	case P2PKH:
		addr, err = btcutil.NewAddressPubKeyHash(hash, d.params)
	case P2WPKH:
		addr, err = btcutil.NewAddressWitnessPubKeyHash(hash, d.params)
	case P2SHP2WPKH:
		redeem := append([]byte{txscript.OP_0, txscript.OP_DATA_20}, hash...)
		addr, err = btcutil.NewAddressScriptHash(redeem, d.params)
	case P2TR:
		tweaked := txscript.ComputeTaprootKeyNoScript(pub)
		addr, err = btcutil.NewAddressTaproot(schnorr.SerializePubKey(tweaked), d.params)
	}
	if err != nil {
		return "", fmt.Errorf("encode address %d: %w", i, err)
	}
	return addr.EncodeAddress(), nil
}

// ValidateAddress checks that s is an address of the given chain.
func ValidateAddress(s, chain string) error {
	params, err := Params(chain)
	if err != nil {
		return err
	}
	addr, err := btcutil.DecodeAddress(s, params)
	if err != nil {
		return fmt.Errorf("address %q is not a valid %s address: %v", s, chain, err)
	}
	if !addr.IsForNet(params) {
		return fmt.Errorf("address %q is not for chain %s", s, chain)
	}
	return nil
}

// ValidTxHash reports whether s looks like a Bitcoin transaction id.
func ValidTxHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// Wallets holds one Deriver per configured extended public key.
type Wallets map[string]*Deriver

// NewWallets builds the derivers of every per-order asset of networks.
func NewWallets(networks []*paywatch.Network) (Wallets, error) {
	w := Wallets{}
	for _, n := range networks {
		for _, a := range n.Assets {
			if a.Mode != paywatch.ModePerOrder {
				continue
			}
			d, err := NewDeriver(a.XPub, n.Chain, a.ScriptType)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", n.Name, a.Symbol, err)
			}
			w[a.XPub] = d
		}
	}
	return w, nil
}

// Address derives the address at index i of the wallet with extended key xpub.
func (w Wallets) Address(xpub string, i uint32) (string, error) {
	d, ok := w[xpub]
	if !ok {
		return "", fmt.Errorf("no wallet for extended key %.12s…", xpub)
	}
	return d.Address(i)
}
