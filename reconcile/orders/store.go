// Package orders keeps order dossiers in PostgreSQL: creation with unique
// pay amounts or derived addresses, reads, the storefront's actions ("I've
// paid", cancel), and the timeline and webhook outbox rows that every change
// writes in its own transaction.
package orders

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// AddressBook derives the receiving address at an index below an extended
// public key (per-order mode).
type AddressBook interface {
	Address(xpub string, index uint32) (string, error)
}

// Store reads and writes order dossiers.
type Store struct {
	db *sqlx.DB
	// Now is the clock; tests replace it.
	Now func() time.Time
	// MonitoringWindow is how long after expiry payments are still matched
	// (and an amount slot stays held).
	MonitoringWindow time.Duration
	// Addresses derives per-order addresses.
	Addresses AddressBook
}

// NewStore returns a Store over db.
func NewStore(db *sqlx.DB, monitoringWindow time.Duration, addresses AddressBook) *Store {
	return &Store{db: db, Now: time.Now, MonitoringWindow: monitoringWindow, Addresses: addresses}
}

// now returns the clock's time in the precision PostgreSQL keeps.
func (s *Store) now() time.Time { return s.Now().UTC().Truncate(time.Microsecond) }

// Tx runs fn in a transaction: committed when fn returns nil, rolled back
// otherwise.
func Tx(ctx context.Context, db *sqlx.DB, fn func(tx *sqlx.Tx) error) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// constraint returns the name of the constraint a PostgreSQL error broke.
func constraint(err error) string {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "23505" {
		return pqErr.Constraint
	}
	return ""
}
