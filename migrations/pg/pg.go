// Package pg holds the PostgreSQL plumbing paywatch's stores share:
// transactions, keyset-paginated lists, text PostgreSQL accepts, and the
// names of violated constraints.
package pg

import (
	"context"
	"database/sql/driver"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch"
)

// NotifyChannel is the channel on which changes that the reconciler should
// look at without waiting for its schedule are announced: a scanner's
// commit (the payload is the network's name) or a customer's tx hash claim.
const NotifyChannel = "paywatch_chain"

// OrderChannel is the channel on which every change to an order (its row,
// its transfers, its mempool sightings) is announced, the payload being the
// order's id: triggers of migration 00007 send them.
const OrderChannel = "paywatch_order"

// sightingsLock is the key of the lock under which the writers of mempool
// sightings take turns: each Bitcoin network's mempool watcher and the
// reconciler's mempool step. Each writes several sightings, in an order of
// its own (the node's, a plan's): two at once could each hold a sighting
// the other waits for. The rule that keeps the lock out of any deadlock:
// no one waits for it while holding a row lock, and no one holding it
// waits for a row lock someone else may hold. The watchers take it first
// and lock no order; the reconciler only tries it, first, and then locks
// its orders skipping those held elsewhere.
const sightingsLock = `hashtextextended('paywatch:mempool_transfers', 0)`

// LockSightings takes the sightings' lock inside tx, waiting for it.
func LockSightings(ctx context.Context, tx *sqlx.Tx) error {
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(`+sightingsLock+`)`); err != nil {
		return fmt.Errorf("take the mempool sightings' lock: %w", err)
	}
	return nil
}

// TryLockSightings takes the sightings' lock inside tx if no one holds it,
// and says whether it did.
func TryLockSightings(ctx context.Context, tx *sqlx.Tx) (bool, error) {
	var ok bool
	if err := tx.GetContext(ctx, &ok, `SELECT pg_try_advisory_xact_lock(`+sightingsLock+`)`); err != nil {
		return false, fmt.Errorf("try the mempool sightings' lock: %w", err)
	}
	return ok, nil
}

// Tx runs fn in a transaction: committed when fn returns nil, rolled back
// otherwise.
func Tx(ctx context.Context, db *sqlx.DB, fn func(tx *sqlx.Tx) error) error {
	tx, err := begin(ctx, db)
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

// begin starts a transaction on a live connection. A pooled connection
// may have died (the server restarted or ended the session, the network
// dropped it); the driver sometimes learns it only from the BEGIN's answer,
// as a network error rather than one the pool retries by itself. Such a
// BEGIN started nothing, and the driver has marked its connection bad, so
// it is sent again on another connection, as Read does.
func begin(ctx context.Context, db *sqlx.DB) (*sqlx.Tx, error) {
	var tx *sqlx.Tx
	err := Read(ctx, db, func() (err error) {
		tx, err = db.BeginTxx(ctx, nil)
		return err
	})
	return tx, err
}

// Trace is told what Read does (the daemon counts and logs it): a load
// balancer that drops idle connections, or a server restarting, shows up
// as reads run again, which the callers never see.
type Trace struct {
	// Retried is called each time a read (or a transaction's BEGIN) runs
	// again because its connection died with err.
	Retried func(err error)
}

type traceKey struct{}

// WithTrace returns ctx carrying t: the reads run with it, or with a
// context made from it, report to t.
func WithTrace(ctx context.Context, t *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// retried tells ctx's Trace, if any, that a read runs again after err.
func retried(ctx context.Context, err error) {
	if t, ok := ctx.Value(traceKey{}).(*Trace); ok && t != nil && t.Retried != nil {
		t.Retried(err)
	}
}

// Read runs fn, a read outside a transaction, again on another connection
// when its connection turned out dead (connectionDied): a read answers the
// same wherever it runs, so the caller (a checkout page polling its order)
// gets its answer instead of an error. It tries again while the pool holds
// idle connections (any of them may be dead too, and the driver drops each
// that fails), then once on a new connection, and never more than the pool
// held at the start, idle or in use, plus one (one in use then may be back
// in the pool, as dead as the rest, by the time the idle ones are tried):
// when every connection fails (the path to the server resets them all),
// each caller costs the server about one new connection (database/sql
// itself may open a second when the first fails as it starts). fn must set
// what it returns afresh each time it runs. Each time it runs again is
// reported to ctx's Trace (WithTrace).
func Read(ctx context.Context, db *sqlx.DB, fn func() error) error {
	tries := db.Stats().OpenConnections + 1
	fresh := false
	for {
		err := fn()
		tries--
		if !connectionDied(ctx, err) || tries <= 0 {
			return err
		}
		if db.Stats().Idle == 0 {
			if fresh {
				return err
			}
			fresh = true
		}
		retried(ctx, err)
	}
}

// connectionDied reports whether err is a connection's death as the driver
// reports it: a network error (not one the pool retries by itself), or the
// driver's "bad connection" (which it gives only when nothing was done,
// as a ping on a dead connection gets when database/sql has run out of
// tries): not a connection that could not be opened at all (dial: the
// server is down or refuses, the caller's to retry), not a timeout, and
// not while ctx is done.
func connectionDied(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if errors.Is(err, driver.ErrBadConn) {
		return true
	}
	var netErr *net.OpError
	return errors.As(err, &netErr) && netErr.Op != "dial" && !netErr.Timeout()
}

// Constraint returns the name of the unique constraint a PostgreSQL error
// broke, or "".
func Constraint(err error) string {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "23505" {
		return pqErr.Constraint
	}
	return ""
}

// ValidText reports whether PostgreSQL can store s as text: valid UTF-8
// without NUL bytes. Identifiers and filters from outside are checked with
// it before they reach a query, which would otherwise fail.
func ValidText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// EncodeCursor makes an opaque page cursor from the last item's sort key.
func EncodeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(at.UnixMicro(), 10) + "|" + id))
}

// DecodeCursor reads a cursor made by EncodeCursor.
func DecodeCursor(c string) (time.Time, string, error) {
	bad := paywatch.Errorf(paywatch.CodeInvalidRequest, "cursor %.40q is not one this server gave out", c)
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", bad
	}
	micros, id, ok := strings.Cut(string(raw), "|")
	n, err := strconv.ParseInt(micros, 10, 64)
	if !ok || err != nil || id == "" || !ValidText(id) {
		return time.Time{}, "", bad
	}
	return time.UnixMicro(n).UTC(), id, nil
}

// Page builds a list query, newest first by (time column, id), one page at
// a time from an opaque cursor.
type Page struct {
	// From is the query up to its WHERE clause ("SELECT … FROM …").
	From string
	// TimeCol and IDCol are the sort key's columns.
	TimeCol, IDCol string
	Limit          int
	Cursor         string
	where          []string
	args           []any
}

// Where adds a condition; each "?" in it is replaced by a parameter
// holding the next of args.
func (p *Page) Where(cond string, args ...any) {
	for _, a := range args {
		p.args = append(p.args, a)
		cond = strings.Replace(cond, "?", "$"+strconv.Itoa(len(p.args)), 1)
	}
	p.where = append(p.where, cond)
}

// SQL returns the query and its parameters. It reads one row more than
// Limit, so that Next can tell whether a next page exists.
func (p *Page) SQL() (string, []any, error) {
	if p.Cursor != "" {
		at, id, err := DecodeCursor(p.Cursor)
		if err != nil {
			return "", nil, err
		}
		p.Where("("+p.TimeCol+", "+p.IDCol+") < (?, ?)", at, id)
	}
	q := p.From
	if len(p.where) > 0 {
		q += " WHERE " + strings.Join(p.where, " AND ")
	}
	args := append(p.args, p.Limit+1)
	q += fmt.Sprintf(" ORDER BY %s DESC, %s DESC LIMIT $%d", p.TimeCol, p.IDCol, len(args))
	return q, args, nil
}

// Next trims rows read by a Page's query to its limit and returns the
// cursor of the next page ("" on the last).
func Next[T any](rows []T, limit int, key func(*T) (time.Time, string)) ([]T, string) {
	if len(rows) <= limit {
		return rows, ""
	}
	rows = rows[:limit]
	return rows, EncodeCursor(key(&rows[len(rows)-1]))
}
