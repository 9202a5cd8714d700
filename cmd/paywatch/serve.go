package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/api"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/metrics"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/outbox"
)

// shutdownTimeout bounds how long in-flight requests may take to finish
// once the daemon is told to stop; those still running then are cut.
const shutdownTimeout = 30 * time.Second

// loadConfig parses the common --config flag (and any flags define adds)
// and loads the file.
func loadConfig(e *env, name string, args []string, define ...func(*flag.FlagSet)) (*config.Config, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	path := fs.String("config", "", "configuration file (YAML)")
	for _, d := range define {
		d(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected arguments: %v", fs.Args())}
	}
	if *path == "" {
		return nil, usageError{errors.New("--config FILE is required")}
	}
	cfg, err := config.Load(*path, e.getenv)
	if err != nil {
		return nil, usageError{err}
	}
	return cfg, nil
}

// openConfigured loads the configuration (with any flags define adds),
// runs validate on the command's own flags, then opens the database,
// migrated: the common start of the one-shot commands.
func openConfigured(ctx context.Context, e *env, name string, args []string, validate func() error,
	define ...func(*flag.FlagSet)) (*config.Config, *sqlx.DB, error) {
	cfg, err := loadConfig(e, name, args, define...)
	if err != nil {
		return nil, nil, err
	}
	if validate != nil {
		if err := validate(); err != nil {
			return nil, nil, err
		}
	}
	db, err := openDatabase(ctx, e.log, cfg.DatabaseURL)
	if err != nil {
		return nil, nil, err
	}
	return cfg, db, nil
}

func migrateCommand(ctx context.Context, e *env, args []string) error {
	_, db, err := openConfigured(ctx, e, "migrate", args, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	fmt.Fprintln(e.stdout, "database schema is up to date")
	return nil
}

func serveCommand(ctx context.Context, e *env, args []string) error {
	cfg, err := loadConfig(e, "serve", args)
	if err != nil {
		return err
	}
	d, err := newDaemon(ctx, e.log, cfg)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Run(ctx)
}

// daemon is the running service: everything serve wires together.
type daemon struct {
	log *slog.Logger
	cfg *config.Config
	db  *sqlx.DB
	// apiDB is the API requests' pool (database_api_conns).
	apiDB *sqlx.DB
	// control holds the leases' connections and serves probes and metrics.
	control  *sqlx.DB
	listener net.Listener
	http     *http.Server
	watchers []watcher
	store    *orders.Store
	// reconciler runs passes while this instance holds its lease.
	reconciler *reconcile.Runner
	// changes wakes long-polling readers of orders.
	changes *orders.Changes
	// sender delivers webhooks while this instance holds its lease; nil
	// when no webhook URL is configured.
	sender *outbox.Sender
	// drainTimeout bounds the drain of in-flight requests at shutdown
	// (shutdownTimeout).
	drainTimeout time.Duration
	// trace counts and logs the reads run again on another connection.
	trace *pg.Trace
}

// watcher scans one network while this instance holds its lease.
type watcher struct {
	network *paywatch.Network
	scanner *scan.Scanner
	// mempool shows Bitcoin payments before a block holds them.
	mempool *bitcoin.Mempool
	close   func()
}

// leaseInterval is how often a standby instance tries to take over a
// network's scanner, and how often the holder checks it still holds it.
const leaseInterval = 2 * time.Second

func newDaemon(ctx context.Context, log *slog.Logger, cfg *config.Config) (*daemon, error) {
	wallets, err := bitcoin.NewWallets(cfg.Networks)
	if err != nil {
		return nil, err
	}
	db, err := openDatabase(ctx, log, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	sealer := orders.NewSealer(cfg.Networks)
	store := orders.NewStore(db, cfg.Orders.MonitoringWindow, wallets)
	store.Sealer = sealer
	// The API's requests share a pool of their own, sized for the cores
	// (database_api_conns): the reconciler's passes, the scanners' commits
	// and the webhook sender keep the main pool, and a burst of requests
	// runs as many statements at once as the database can, the rest
	// waiting in the pool for a connection.
	apiConns := cfg.DatabaseAPIConns
	if apiConns <= 0 { // a Config built without Parse
		apiConns = config.DefaultDatabaseAPIConns()
	}
	apiDB, err := openPool(ctx, cfg.DatabaseURL, "paywatch-api", apiConns)
	if err != nil {
		db.Close()
		return nil, err
	}
	apiStore := orders.NewStore(apiDB, cfg.Orders.MonitoringWindow, wallets)
	apiStore.Sealer = sealer
	// A burst of creations leaves a connection to the other requests.
	apiStore.LimitCreations(apiConns - 1)
	// Its connections open before the API listens: the first requests
	// after a start do not queue while they open.
	warmCtx, cancelWarm := context.WithTimeout(ctx, 10*time.Second)
	if err := apiStore.Warm(warmCtx, apiConns); err != nil {
		log.Warn("could not open the database connections ahead of requests", "err", err)
	}
	cancelWarm()
	scans := scan.NewStore(db)
	scans.Log = log
	rec := newReconciler(db, log, cfg)
	rec.Record = scans.Record
	listenURL := named(cfg.DatabaseURL, "paywatch") // the listeners' sessions, named as the main pool's
	runner := reconcile.NewRunner(rec, cfg.ReconcilerSchedule, listenURL, scan.NotifyChannel, log)
	changes := orders.NewChanges(listenURL, log)
	// Leases, probes and metrics get connections of their own: a burst of
	// API requests never holds them up (and leases, which keep a
	// connection while held, take none from the other pools).
	control, err := openPool(ctx, cfg.DatabaseURL, "paywatch-control", controlConns(cfg))
	if err != nil {
		db.Close()
		apiDB.Close()
		return nil, err
	}
	m := metrics.New(control, log)
	m.Pools(map[string]*sql.DB{"paywatch": db.DB, "paywatch-api": apiDB.DB, "paywatch-control": control.DB})
	runner.Observe = m.Pass
	op := reconcile.NewOperator(apiDB)
	op.Sealer = sealer
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		db.Close()
		apiDB.Close()
		control.Close()
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	apiChains := scan.NewStore(apiDB)
	apiChains.Log = log
	apiServer := api.New(cfg, api.Deps{Orders: apiStore, Chains: apiChains, Operator: op,
		Ledger: ledger.NewBook(apiDB), Webhooks: outbox.NewStore(apiDB), Changes: changes, Nudge: runner.Nudge, Probes: scan.NewStore(control),
		Metrics: m.Handler(), Schema: schemaVersion(control)}, log)
	trace := m.Trace()
	srv := &http.Server{
		Handler: apiServer.Handler(),
		// Requests' reads report their retries (a request's context
		// comes from this one, cancelled when its client goes).
		BaseContext:       func(net.Listener) context.Context { return pg.WithTrace(context.Background(), trace) },
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      api.MaxWait + 30*time.Second, // long-polls hold up to MaxWait
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	srv.RegisterOnShutdown(apiServer.Drain)
	d := &daemon{log: log, cfg: cfg, db: db, apiDB: apiDB, control: control, listener: ln, http: srv, store: store, reconciler: runner, changes: changes,
		drainTimeout: shutdownTimeout, trace: trace}
	if cfg.WebhookURL != "" {
		d.sender = newSender(db, log, cfg)
		d.sender.Metrics = m.Webhook
	}
	for _, n := range cfg.Networks {
		src, closeSrc, err := newSource(n, wallets, store, log)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("network %s: %w", n.Name, err)
		}
		w := watcher{network: n, scanner: scan.NewScanner(n, src, scans, log), close: closeSrc}
		w.scanner.Observer = m
		if b, ok := src.(*bitcoin.Source); ok {
			w.mempool = bitcoin.NewMempool(b, db, log)
		}
		d.watchers = append(d.watchers, w)
		rec.Lookups[n.Name] = src
	}
	return d, nil
}

// Run serves until ctx is cancelled, then drains in-flight requests.
func (d *daemon) Run(ctx context.Context) error {
	ctx = pg.WithTrace(ctx, d.trace)
	d.log.Info("paywatch listening", "addr", d.listener.Addr().String(), "networks", len(d.cfg.Networks))
	errc := make(chan error, 1)
	go func() { errc <- d.http.Serve(d.listener) }()
	watchCtx, stopWatchers := context.WithCancel(ctx)
	defer stopWatchers()
	var wg sync.WaitGroup
	for _, w := range d.watchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := scan.RunLeased(watchCtx, d.control, "scan:"+w.network.Name, leaseInterval, d.log, w.scanner.Run)
			if err != nil && watchCtx.Err() == nil {
				d.log.Error("watcher stopped", "network", w.network.Name, "err", err)
			}
		}()
		if w.mempool == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := scan.RunLeased(watchCtx, d.control, "mempool:"+w.network.Name, leaseInterval, d.log, w.mempool.Run)
			if err != nil && watchCtx.Err() == nil {
				d.log.Error("mempool watcher stopped", "network", w.network.Name, "err", err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		watchGaps(watchCtx, d.log, d.store, d.cfg.Networks)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = d.changes.Run(watchCtx)
	}()
	if d.sender != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := scan.RunLeased(watchCtx, d.control, "webhooks", leaseInterval, d.log, d.sender.Run)
			if err != nil && watchCtx.Err() == nil {
				d.log.Error("webhook sender stopped", "err", err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := scan.RunLeased(watchCtx, d.control, "reconcile", leaseInterval, d.log, d.reconciler.Run)
		if err != nil && watchCtx.Err() == nil {
			d.log.Error("reconciler stopped", "err", err)
		}
	}()
	select {
	case err := <-errc:
		stopWatchers()
		wg.Wait()
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	stopWatchers()
	d.log.Info("shutting down: draining requests")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), d.drainTimeout)
	defer cancel()
	if err := d.http.Shutdown(shutdownCtx); err != nil {
		// Past the bound, the requests still running are cut: a client
		// that never finishes does not keep the daemon from stopping.
		d.log.Warn("requests still in flight at the end of the drain were cut", "drain_timeout", d.drainTimeout, "err", err)
		_ = d.http.Close()
	}
	wg.Wait()
	d.log.Info("stopped")
	return nil
}

// Close releases what the daemon holds.
func (d *daemon) Close() {
	for _, w := range d.watchers {
		w.close()
	}
	d.listener.Close()
	d.db.Close()
	d.apiDB.Close()
	d.control.Close()
}

// schemaVersion reads the schema's version for /readyz, on another
// connection if the first one it tried had died (pg.Read).
func schemaVersion(db *sqlx.DB) func(ctx context.Context) (current, latest int64, err error) {
	return func(ctx context.Context) (current, latest int64, err error) {
		err = pg.Read(ctx, db, func() (err error) {
			current, latest, err = migrations.Version(ctx, db.DB)
			return err
		})
		return current, latest, err
	}
}

// controlConns is how many connections the control pool may hold: one per
// lease this daemon may hold at once (a scanner per network, a mempool
// watcher per Bitcoin network, the reconciler, the webhook sender), and
// room for probes, metrics and the standby's lease attempts.
func controlConns(cfg *config.Config) int {
	n := 2 + 4
	for _, net := range cfg.Networks {
		n++
		if net.Family == paywatch.FamilyBitcoin {
			n++
		}
	}
	return n
}

// newReconciler builds the reconciler the configuration describes.
func newReconciler(db *sqlx.DB, log *slog.Logger, cfg *config.Config) *reconcile.Reconciler {
	r := reconcile.New(db, log, cfg.Orders.PaidGrace, cfg.Orders.MaxExpiry+cfg.Orders.MonitoringWindow)
	r.Lookups = map[string]reconcile.TxLookup{}
	r.Sealer = orders.NewSealer(cfg.Networks)
	return r
}

// newSender builds the webhook sender the configuration describes.
func newSender(db *sqlx.DB, log *slog.Logger, cfg *config.Config) *outbox.Sender {
	s := outbox.NewSender(db, cfg.WebhookURL, cfg.WebhookSecret,
		outbox.Client(cfg.WebhookAllowPrivate, outbox.DefaultTimeout), log)
	s.MaxRetryAge = cfg.WebhookMaxRetryAge
	s.DSN = cfg.DatabaseURL
	s.Sealer = orders.NewSealer(cfg.Networks)
	return s
}

func reconcileCommand(ctx context.Context, e *env, args []string) error {
	var once bool
	cfg, db, err := openConfigured(ctx, e, "reconcile", args, func() error {
		if !once {
			return usageError{errors.New("only --once is supported: serve runs the scheduled reconciler")}
		}
		return nil
	}, func(fs *flag.FlagSet) {
		fs.BoolVar(&once, "once", false, "run one pass, then exit")
	})
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := newReconciler(db, e.log, cfg).Pass(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "reconciled: %s\n", res)
	return nil
}
