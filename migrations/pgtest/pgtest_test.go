package pgtest_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/paywatch/paywatch/migrations/pgtest"
)

// TestMissingServerFailsUnderCI runs this test binary again, as a test
// that asks pgtest for a database on a server that is not there: with CI
// set the test fails (so that CI cannot go green by skipping every
// database test); without it, the test is skipped.
func TestMissingServerFailsUnderCI(t *testing.T) {
	run := func(ci string) (string, error) {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestAskForADatabase$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "CI="+ci,
			"PAYWATCH_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:9/postgres?sslmode=disable&connect_timeout=5")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("true")
	if err == nil || !strings.Contains(out, "--- FAIL: TestAskForADatabase") || !strings.Contains(out, "pgtest: no PostgreSQL at") {
		t.Fatalf("with CI=true and no server: %v\n%s", err, out)
	}
	out, err = run("")
	if err != nil || !strings.Contains(out, "--- SKIP: TestAskForADatabase") {
		t.Fatalf("without CI and no server: %v\n%s", err, out)
	}
}

// TestAskForADatabase is what TestMissingServerFailsUnderCI runs in a
// child process; run directly, it gets a database from the test server.
func TestAskForADatabase(t *testing.T) {
	db := pgtest.New(t)
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
}
