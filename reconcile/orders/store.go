// Package orders keeps order dossiers in PostgreSQL: creation with unique
// pay amounts or derived addresses, reads, the storefront's actions ("I've
// paid", cancel), and the timeline and webhook outbox rows that every change
// writes in its own transaction.
package orders

import (
	"crypto/rand"
	"fmt"
	"io"
	"math/big"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
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
	// Rand returns a uniformly random int in [0, n): where the search for
	// a free unique amount starts. Cryptographically random unless a test
	// replaces it.
	Rand func(n int) int
	// entropy is what the draw reads when Rand is nil: crypto/rand.Reader.
	entropy io.Reader
	// Sealer writes webhook bodies in the transactions that enqueue them.
	Sealer *Sealer

	// creating admits creations to the database in the order they came
	// (NewStore): see insert.
	creating chan struct{}

	stmtMu sync.Mutex
	// stmts are the statements prepared once (statement), by their text:
	// the reads of Get, the creations' slot statements; missed those a
	// creation's transaction ran unprepared (preparedTx).
	stmts  map[string]*sqlx.Stmt
	missed map[string]bool
}

func (s *Store) rand(n int) (int, error) {
	if s.Rand != nil {
		return s.Rand(n), nil
	}
	src := s.entropy
	if src == nil {
		src = rand.Reader
	}
	v, err := rand.Int(src, big.NewInt(int64(n)))
	if err != nil {
		return 0, fmt.Errorf("draw a unique amount: %w", err)
	}
	return int(v.Int64()), nil
}

// NewStore returns a Store over db.
func NewStore(db *sqlx.DB, monitoringWindow time.Duration, addresses AddressBook) *Store {
	return &Store{db: db, Now: time.Now, MonitoringWindow: monitoringWindow, Addresses: addresses, entropy: rand.Reader,
		creating: make(chan struct{}, maxCreating)}
}

// LimitCreations lowers how many creations the store runs in the database
// at once to n (at least 1, at most maxCreating): each holds a connection
// of the pool for its transaction, and a pool of few connections keeps
// some for the reads. Call it before the store is used.
func (s *Store) LimitCreations(n int) { s.creating = make(chan struct{}, max(1, min(n, maxCreating))) }

// now returns the clock's time in the precision PostgreSQL keeps.
func (s *Store) now() time.Time { return s.Now().UTC().Truncate(time.Microsecond) }
