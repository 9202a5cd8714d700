package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"github.com/paywatch/paywatch/migrations"
)

// openDatabase connects to the configured database, creating it first when
// the server answers but the database does not exist yet, and applies
// pending migrations.
func openDatabase(ctx context.Context, log *slog.Logger, dsn string) (*sqlx.DB, error) {
	dsn = named(dsn, "paywatch")
	db, err := migrations.Open(ctx, dsn)
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "3D000" { // invalid_catalog_name
		if err = createDatabase(ctx, dsn); err == nil {
			log.Info("created database", "url", redact(dsn))
			db, err = migrations.Open(ctx, dsn)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact(dsn), err)
	}
	applied, err := migrations.Up(ctx, db.DB)
	if err != nil {
		db.Close()
		return nil, err
	}
	if len(applied) > 0 {
		log.Info("applied migrations", "versions", applied)
	}
	return db, nil
}

func createDatabase(ctx context.Context, dsn string) error {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return fmt.Errorf("database does not exist (and the URL is not a postgres:// URL, so it cannot be created)")
	}
	name := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	admin, err := sql.Open("postgres", u.String())
	if err != nil {
		return err
	}
	defer admin.Close()
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+pq.QuoteIdentifier(name))
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "42P04" { // created concurrently
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	return nil
}

// redact hides the password of a database URL (in its user part or its
// query) or of a key=value DSN.
func redact(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return dsnPassword.ReplaceAllString(dsn, "${1}xxxxx")
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// dsnPassword finds the password of a key=value DSN, quoted or not.
var dsnPassword = regexp.MustCompile(`(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// openPool opens another pool of at most conns connections to the
// (migrated) database. name, the sessions' fallback_application_name
// (named), tells in pg_stat_activity which part of paywatch holds a
// connection.
func openPool(ctx context.Context, dsn, name string, conns int) (*sqlx.DB, error) {
	dsn = named(dsn, name)
	db, err := migrations.Open(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", redact(dsn), err)
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}

// named gives the sessions of a database URL or key=value DSN a
// fallback_application_name: the name shows in pg_stat_activity unless the
// URL sets application_name or PGAPPNAME does.
func named(dsn, name string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		q := u.Query()
		if q.Get("fallback_application_name") != "" {
			return dsn
		}
		q.Set("fallback_application_name", name)
		u.RawQuery = q.Encode()
		return u.String()
	}
	if strings.Contains(dsn, "fallback_application_name=") {
		return dsn
	}
	return strings.TrimSpace(dsn) + " fallback_application_name=" + name
}
