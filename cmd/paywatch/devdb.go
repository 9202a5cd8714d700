//go:build !nodev

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// serverAnswers reports whether a PostgreSQL server accepts connections at
// dsn (the database itself need not exist).
func serverAnswers(ctx context.Context, dsn string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return false
	}
	defer db.Close()
	err = db.PingContext(ctx)
	var pqErr interface{ SQLState() string }
	// A missing database still means a server that answers.
	return err == nil || (errors.As(err, &pqErr) && pqErr.SQLState() == "3D000")
}

// postgresBinDirs is where PostgreSQL's server programs are looked for
// when PATH has none (Debian's and Ubuntu's packages put them there).
var postgresBinDirs = "/usr/lib/postgresql/*/bin"

// postgresBin finds a PostgreSQL server program: on PATH, else in the
// newest of postgresBinDirs.
func postgresBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	dirs, _ := filepath.Glob(postgresBinDirs)
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if p := filepath.Join(d, name); fileExists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH or in %s: install PostgreSQL's server package, or set PAYWATCH_DATABASE_URL", name, postgresBinDirs)
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// localPostgres is a throwaway PostgreSQL cluster in a temporary directory.
type localPostgres struct {
	dir    string
	pgctl  string
	opts   string // the server's options, to start it again
	cred   *syscall.Credential
	URL    string
	stderr *os.File
}

// startLocalPostgres initialises and starts a cluster that listens on a
// unix socket only, in its own 0700 directory: trust authentication then
// lets in this user alone (no TCP port another local user could reach).
// Run as root, it runs as the postgres user (or nobody), as PostgreSQL
// refuses root.
func startLocalPostgres(ctx context.Context, log *slog.Logger) (*localPostgres, error) {
	initdb, err := postgresBin("initdb")
	if err != nil {
		return nil, err
	}
	pgctl, err := postgresBin("pg_ctl")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "paywatch-dev-pg-")
	if err != nil {
		return nil, err
	}
	p := &localPostgres{dir: dir, pgctl: pgctl}
	if os.Geteuid() == 0 {
		if p.cred, err = unprivileged(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := os.Chown(dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	data := filepath.Join(dir, "data")
	log.Info("starting a throwaway PostgreSQL cluster", "dir", dir, "port", port)
	if err := p.run(ctx, initdb, "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w", err)
	}
	p.opts = fmt.Sprintf("-p %d -k %s -c listen_addresses='' -c fsync=off -c synchronous_commit=off", port, dir)
	if err := p.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.URL = fmt.Sprintf("postgres://postgres@/paywatch?host=%s&port=%d&sslmode=disable", url.QueryEscape(dir), port)
	return p, nil
}

func (p *localPostgres) run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = p.dir
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
}

// start starts the cluster's server.
func (p *localPostgres) start(ctx context.Context) error {
	if err := p.run(ctx, p.pgctl, "-D", filepath.Join(p.dir, "data"), "-o", p.opts, "-l", filepath.Join(p.dir, "server.log"),
		"-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("pg_ctl start: %w", err)
	}
	return nil
}

// stopServer stops the cluster's server (sessions cut at once) and keeps
// its data for start.
func (p *localPostgres) stopServer(ctx context.Context) error {
	if err := p.run(ctx, p.pgctl, "-D", filepath.Join(p.dir, "data"), "-m", "fast", "-w", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop: %w", err)
	}
	return nil
}

// Stop stops the cluster and removes its directory.
func (p *localPostgres) Stop() {
	_ = p.run(context.Background(), p.pgctl, "-D", filepath.Join(p.dir, "data"), "-m", "immediate", "-w", "stop")
	os.RemoveAll(p.dir)
}

// unprivileged returns the postgres user, or nobody.
func unprivileged() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 == nil && err2 == nil {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
		}
	}
	return nil, errors.New("running as root and no postgres or nobody user to run PostgreSQL as")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
