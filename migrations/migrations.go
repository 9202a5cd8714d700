// Package migrations holds paywatch's SQL schema, embedded in the binary,
// and applies it with goose.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// ErrSchemaNewer reports a database migrated by a later release than this
// one.
var ErrSchemaNewer = errors.New("database schema is newer than this release")

// Up applies every pending migration. It is safe to call on every start
// and from several processes at once: goose serialises them with a
// PostgreSQL advisory lock. It returns the versions it applied.
func Up(ctx context.Context, db *sql.DB) ([]int64, error) {
	p, err := provider(db, true)
	if err != nil {
		return nil, err
	}
	results, err := p.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("apply migrations: %w", err)
	}
	// A schema a later release migrated is not this release's to run on:
	// what it wrote may mean something this release would misread (money
	// included). Checked after Up, so that a later release migrating at the
	// same moment is seen too.
	current, latest, err := versions(ctx, p)
	if err != nil {
		return nil, err
	}
	if current > latest {
		return nil, fmt.Errorf("%w: the database is at version %d, this release knows up to %d; run the release that migrated it, or roll the schema back with that release's migrations first",
			ErrSchemaNewer, current, latest)
	}
	applied := make([]int64, 0, len(results))
	for _, r := range results {
		applied = append(applied, r.Source.Version)
	}
	return applied, nil
}

// UpTo applies the pending migrations up to version and no further: an
// upgrade over a database that already holds data is tested with it.
func UpTo(ctx context.Context, db *sql.DB, version int64) error {
	p, err := provider(db, true)
	if err != nil {
		return err
	}
	if _, err := p.UpTo(ctx, version); err != nil {
		return fmt.Errorf("apply migrations up to %d: %w", version, err)
	}
	return nil
}

// Version returns the schema version of db and the newest version this
// binary knows. It reads without the migration lock: /readyz asks it, and
// a daemon whose schema is current stays ready while another one migrates.
func Version(ctx context.Context, db *sql.DB) (current, latest int64, err error) {
	p, err := provider(db, false)
	if err != nil {
		return 0, 0, err
	}
	return versions(ctx, p)
}

// versions returns the schema version of p's database and the newest
// version p knows.
func versions(ctx context.Context, p *goose.Provider) (current, latest int64, err error) {
	current, err = p.GetDBVersion(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read schema version: %w", err)
	}
	if sources := p.ListSources(); len(sources) > 0 {
		latest = sources[len(sources)-1].Version
	}
	return current, latest, nil
}

// provider is goose over db with paywatch's migrations; locked, with the
// migration lock taken around what it does.
func provider(db *sql.DB, locked bool) (*goose.Provider, error) {
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}
	if locked {
		// Poll the lock every second for up to five minutes: a daemon
		// starting beside another that is migrating waits for it.
		locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
		if err != nil {
			return nil, fmt.Errorf("migration lock: %w", err)
		}
		opts = append(opts, goose.WithSessionLocker(locker))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, opts...)
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, nil
}
