package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/paywatch/paywatch/chains/bitcoin"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/api"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/reconcile/orders"
)

// shutdownTimeout bounds how long in-flight requests may take to finish.
const shutdownTimeout = 30 * time.Second

// loadConfig parses the common --config flag and loads the file.
func loadConfig(e *env, name string, args []string) (*config.Config, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	path := fs.String("config", "", "configuration file (YAML)")
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

func migrateCommand(ctx context.Context, e *env, args []string) error {
	cfg, err := loadConfig(e, "migrate", args)
	if err != nil {
		return err
	}
	db, err := openDatabase(ctx, e.log, cfg.DatabaseURL)
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
	log      *slog.Logger
	cfg      *config.Config
	db       *sqlx.DB
	listener net.Listener
	http     *http.Server
}

func newDaemon(ctx context.Context, log *slog.Logger, cfg *config.Config) (*daemon, error) {
	wallets, err := bitcoin.NewWallets(cfg.Networks)
	if err != nil {
		return nil, err
	}
	db, err := openDatabase(ctx, log, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	store := orders.NewStore(db, cfg.Orders.MonitoringWindow, wallets)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	srv := &http.Server{
		Handler:           api.New(cfg, store, log).Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return &daemon{log: log, cfg: cfg, db: db, listener: ln, http: srv}, nil
}

// Run serves until ctx is cancelled, then drains in-flight requests.
func (d *daemon) Run(ctx context.Context) error {
	d.log.Info("paywatch listening", "addr", d.listener.Addr().String(), "networks", len(d.cfg.Networks))
	errc := make(chan error, 1)
	go func() { errc <- d.http.Serve(d.listener) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	d.log.Info("shutting down: draining requests")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := d.http.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	d.log.Info("stopped")
	return nil
}

// Close releases what the daemon holds.
func (d *daemon) Close() {
	d.listener.Close()
	d.db.Close()
}
