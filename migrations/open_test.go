package migrations_test

import (
	"context"
	"testing"

	"github.com/paywatch/paywatch/migrations"
	"github.com/paywatch/paywatch/migrations/pgtest"
)

// Sessions paywatch opens run with jit=off (the reconciler's statements
// have large estimated costs and tiny real ones) unless the URL says
// otherwise.
func TestSessionsRunWithJITOff(t *testing.T) {
	ctx := context.Background()
	u := pgtest.NewURL(t)
	db, err := migrations.Open(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // the setting is per session: read it on the same one
	var jit string
	if err := db.Get(&jit, `SHOW jit`); err != nil {
		t.Fatal(err)
	}
	if jit != "off" {
		t.Fatalf("a paywatch session runs with jit=%s, want off", jit)
	}
	on, err := migrations.Open(ctx, u+"&jit=on")
	if err != nil {
		t.Fatal(err)
	}
	defer on.Close()
	if err := on.Get(&jit, `SHOW jit`); err != nil || jit != "on" {
		t.Fatalf("a URL asking jit=on gets jit=%s (%v), want on", jit, err)
	}
}
