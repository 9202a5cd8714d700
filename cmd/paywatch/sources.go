package main

import (
	"fmt"
	"log/slog"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/evm"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/reconcile"
)

// source is a network's chain adapter: what the scanner reads and what
// customers' tx hashes are looked up with.
type source interface {
	scan.Source
	reconcile.TxLookup
}

// newSource builds the chain adapter of a network. given tells a Bitcoin
// watcher which addresses orders were handed (the order store); close
// releases the adapter.
func newSource(n *paywatch.Network, wallets bitcoin.Wallets, given bitcoin.Given, log *slog.Logger) (source, func(), error) {
	switch n.Family {
	case paywatch.FamilyEVM:
		src, err := evm.NewSource(n, log)
		if err != nil {
			return nil, nil, err
		}
		return src, src.Close, nil
	case paywatch.FamilyBitcoin:
		var shared []string
		derivers := map[string]*bitcoin.Deriver{}
		for _, a := range n.Assets {
			shared = append(shared, a.Addresses...)
			if a.XPub != "" {
				derivers[a.XPub] = wallets[a.XPub]
			}
		}
		watch, err := bitcoin.NewWatchSet(n.Chain, shared, derivers, given)
		if err != nil {
			return nil, nil, err
		}
		src, err := bitcoin.NewSource(n, bitcoin.Credentials{User: n.RPCUser, Pass: n.RPCPass,
			CookieFile: n.RPCCookieFile, CertFile: n.RPCCertFile}, watch, log)
		if err != nil {
			return nil, nil, err
		}
		return src, func() {}, nil
	}
	return nil, nil, fmt.Errorf("no watcher for chain family %q", n.Family)
}
