// Command paywatch is the paywatch daemon and its operator tools: a
// self-hosted crypto payment watcher and reconciliation service.
//
//	paywatch serve   --config FILE   the daemon: API, chain watchers, reconciler
//	paywatch migrate --config FILE   apply pending database migrations, then exit
//	paywatch reconcile --config FILE --once   one reconciler pass
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// usageError marks errors in how the command was called or configured.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// env is the process environment, injected so that tests can run commands
// in-process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	log            *slog.Logger
}

const usage = `paywatch: a self-hosted crypto payment watcher and reconciliation daemon

Usage:
  paywatch serve   --config FILE   run the daemon: API, chain watchers, reconciler
  paywatch migrate --config FILE   apply pending database migrations, then exit
  paywatch reconcile --config FILE --once
                                   run one reconciler pass, then exit
  paywatch rescan --config FILE --network NAME --from BLOCK
                                   rewind a network's scanner (after a halt)
  paywatch check   --config FILE   verify the invariants over the database
  paywatch dev [--listen ADDR]     a development chain, a local database and the API,
                                   with keys and a demo order to pay (see dev --help)
  paywatch dev pay ORDER_ID [--amount X]
                                   pay an order from the development faucet
  paywatch orders | transfers | resolve | webhooks | networks
                                   operator commands against a running daemon's API
                                   (--api URL, key in PAYWATCH_API_KEY; see orders --help)
  paywatch help                    show this help

See README.md for the configuration and the HTTP API.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	level, levelErr := logLevel(getenv("PAYWATCH_LOG_LEVEL"))
	e := &env{stdout: stdout, stderr: stderr, getenv: getenv,
		log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	if levelErr != nil && args[0] != "help" && args[0] != "-h" && args[0] != "--help" {
		// A misspelt level is refused rather than taken for info: the
		// logs would quietly not be what was asked for.
		fmt.Fprintf(stderr, "paywatch %s: %v\n", args[0], levelErr)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "serve":
		err = serveCommand(ctx, e, args[1:])
	case "migrate":
		err = migrateCommand(ctx, e, args[1:])
	case "reconcile":
		err = reconcileCommand(ctx, e, args[1:])
	case "rescan":
		err = rescanCommand(ctx, e, args[1:])
	case "check":
		err = checkCommand(ctx, e, args[1:])
	case "dev":
		err = devCommand(ctx, e, args[1:])
	case "orders":
		err = ordersCommand(ctx, e, args[1:])
	case "transfers":
		err = transfersCommand(ctx, e, args[1:])
	case "resolve":
		err = resolveCommand(ctx, e, args[1:])
	case "webhooks":
		err = webhooksCommand(ctx, e, args[1:])
	case "networks":
		err = networksCommand(ctx, e, args[1:])
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "paywatch: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	fmt.Fprintf(stderr, "paywatch %s: %v\n", args[0], err)
	if errors.As(err, new(usageError)) {
		return exitUsage
	}
	return exitError
}

// logLevel reads PAYWATCH_LOG_LEVEL: debug, info (also when empty), warn
// or error, in any case (slog's offsets such as "debug+2" are taken too).
func logLevel(s string) (slog.Level, error) {
	if s == "" {
		return slog.LevelInfo, nil
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo, fmt.Errorf("PAYWATCH_LOG_LEVEL=%q is not a log level: use debug, info, warn or error", s)
	}
	return l, nil
}
