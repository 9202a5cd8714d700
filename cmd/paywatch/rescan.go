package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/scan"
)

// rescanCommand rewinds a network's scanner to rescan from a block: what an
// operator does after a reorg deeper than the kept window halted it. The
// running daemons pick the new cursor up at their next step.
func rescanCommand(ctx context.Context, e *env, args []string) error {
	var network string
	var from uint64
	cfg, err := loadConfig(e, "rescan", args, func(fs *flag.FlagSet) {
		fs.StringVar(&network, "network", "", "the network to rescan")
		fs.Uint64Var(&from, "from", 0, "the first block to scan again (at least 1)")
	})
	if err != nil {
		return err
	}
	n := cfg.Network(network)
	switch {
	case network == "":
		return usageError{errors.New("--network NAME is required")}
	case n == nil:
		return usageError{fmt.Errorf("network %q is not configured", network)}
	case from < 1:
		return usageError{errors.New("--from BLOCK is required (at least 1)")}
	}
	wallets, err := bitcoin.NewWallets(cfg.Networks)
	if err != nil {
		return err
	}
	src, closeSrc, err := newSource(n, wallets, nil, e.log)
	if err != nil {
		return err
	}
	defer closeSrc()
	hash, err := src.BlockHash(ctx, from-1)
	if err != nil {
		return fmt.Errorf("read block %d from the node: %w", from-1, err)
	}
	db, err := openDatabase(ctx, e.log, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	orphaned, err := scan.NewStore(db).Rewind(ctx, network, scan.Block{Number: from - 1, Hash: hash})
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s rewound to block %d (%s); %d transfers above it are orphaned until the rescan sees them again\n",
		network, from-1, hash, orphaned)
	return nil
}
