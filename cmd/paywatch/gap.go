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
	g := newGapWatch(log, store, networks)
	for {
		g.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(gapCheckInterval):
		}
	}
}

// gapWatch remembers when each key's run was last warned about.
type gapWatch struct {
	log      *slog.Logger
	store    *orders.Store
	networks []*paywatch.Network
	now      func() time.Time
	warned   map[string]time.Time
}

func newGapWatch(log *slog.Logger, store *orders.Store, networks []*paywatch.Network) *gapWatch {
	return &gapWatch{log: log, store: store, networks: networks, now: time.Now, warned: map[string]time.Time{}}
}

// check reads every derived-address run once and warns about each one at
// its gap limit, unless it was warned about less than gapRewarn ago.
func (w *gapWatch) check(ctx context.Context) {
	for _, n := range w.networks {
		for _, a := range n.Assets {
			if a.XPub == "" || a.GapLimit <= 0 {
				continue
			}
			g, err := w.store.Gap(ctx, n.Name, a.XPub)
			if err != nil {
				if ctx.Err() == nil {
					w.log.Warn("could not check the gap of unpaid addresses", "network", n.Name, "asset", a.Symbol, "err", err)
				}
				continue
			}
			key := n.Name + "/" + a.Symbol
			if g.Unpaid < int64(a.GapLimit) {
				delete(w.warned, key)
				continue
			}
			now := w.now()
			if last, ok := w.warned[key]; ok && now.Sub(last) < gapRewarn {
				continue
			}
			w.warned[key] = now
			w.log.Warn("unpaid derived addresses past the gap limit: a wallet restored from the key finds later payments only with a larger gap limit",
				"network", n.Name, "asset", a.Symbol, "unpaid_run", g.Unpaid, "gap_limit", a.GapLimit,
				"last_paid_index", g.LastPaid, "addresses_given", g.Given, "wallet_gap_limit_needed", g.Unpaid+1)
		}
	}
}
