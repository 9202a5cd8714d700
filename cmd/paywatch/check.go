package main

import (
	"context"
	"fmt"

	"github.com/paywatch/paywatch/reconcile"
)

// checkCommand verifies the invariants (reconcile.Invariants) over the database and exits
// non-zero, listing every violation, when one does not hold.
func checkCommand(ctx context.Context, e *env, args []string) error {
	_, db, err := openConfigured(ctx, e, "check", args, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := reconcile.CheckInvariants(ctx, db); err != nil {
		return fmt.Errorf("invariants violated:\n%w", err)
	}
	fmt.Fprintln(e.stdout, "invariants hold: transfers recorded once, settled orders paid exactly, ledger balanced, pay amounts unique, no status moved backwards")
	return nil
}
