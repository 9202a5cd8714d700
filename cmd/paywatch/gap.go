package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// gapCheckInterval is how often the runs of unpaid derived addresses are
// checked against the configured gap limits; gapRewarn how often a run
// still over its limit is warned about again.
const (
	gapCheckInterval = time.Minute
	gapRewarn        = time.Hour
)

// watchGaps warns in the log when the run of unpaid addresses derived from
// an extended public key reaches the asset's gap_limit: a wallet restored
// from the key with that gap limit would not find the next payments. It
// runs until ctx ends.
func watchGaps(ctx context.Context, log *slog.Logger, store *orders.Store, networks []*paywatch.Network) {
	warned := map[string]time.Time{}
	for {
		for _, n := range networks {
			for _, a := range n.Assets {
				if a.XPub == "" || a.GapLimit <= 0 {
					continue
				}
				g, err := store.Gap(ctx, n.Name, a.XPub)
				if err != nil {
					if ctx.Err() == nil {
						log.Warn("could not check the gap of unpaid addresses", "network", n.Name, "asset", a.Symbol, "err", err)
					}
					continue
				}
				key := n.Name + "/" + a.Symbol
				if g.Unpaid < int64(a.GapLimit) {
					delete(warned, key)
					continue
				}
				if last, ok := warned[key]; ok && time.Since(last) < gapRewarn {
					continue
				}
				warned[key] = time.Now()
				log.Warn("unpaid derived addresses past the gap limit: a wallet restored from the key finds later payments only with a larger gap limit",
					"network", n.Name, "asset", a.Symbol, "unpaid_run", g.Unpaid, "gap_limit", a.GapLimit,
					"last_paid_index", g.LastPaid, "addresses_given", g.Given, "wallet_gap_limit_needed", g.Unpaid+1)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(gapCheckInterval):
		}
	}
}
