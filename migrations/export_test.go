package migrations

import (
	"context"
	"database/sql"
	"fmt"
)

// DownTo rolls db back to version, under the migration lock: the tests
// run every migration's Down with it.
func DownTo(ctx context.Context, db *sql.DB, version int64) error {
	p, err := provider(db, true)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, version); err != nil {
		return fmt.Errorf("roll migrations back to %d: %w", version, err)
	}
	return nil
}
