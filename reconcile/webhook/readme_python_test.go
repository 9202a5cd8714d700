package webhook_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/paywatch/paywatch/reconcile/webhook"
)

// readmePython returns the Python snippet README.md gives after "The same
// check in Python:", between its ```python fence and the closing fence.
func readmePython(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate this test file to find README.md")
	}
	path := filepath.Join(filepath.Dir(file), "..", "..", "README.md")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read README.md: %v", err)
	}
	readme := string(raw)
	_, after, ok := strings.Cut(readme, "The same check in Python:")
	if !ok {
		t.Fatalf("%s has no \"The same check in Python:\" passage", path)
	}
	_, after, ok = strings.Cut(after, "```python\n")
	if !ok {
		t.Fatalf("%s: no ```python fence after \"The same check in Python:\"", path)
	}
	code, _, ok := strings.Cut(after, "\n```")
	if !ok {
		t.Fatalf("%s: the Python snippet has no closing fence", path)
	}
	if !strings.Contains(code, "def verify(") {
		t.Fatalf("%s: the Python snippet defines no verify function:\n%s", path, code)
	}
	return code + "\n"
}

// README: "The same check in Python:" followed by a verify(secret, header,
// body) function. Run as written, it accepts what paywatch signs and
// rejects a changed body, a wrong secret and a stale (or far future)
// timestamp, agreeing with webhook.Verify on every case.
func TestReadmePythonVerifyAcceptsPaywatchSignaturesAndRejectsTampering(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to check README.md's Python snippet and is not on PATH: %v", err)
	}
	const secret = "whsec_python"
	body := []byte(`{"id":"evt_1","type":"order.settled","created_at":"2027-01-15T08:00:00Z","order":{"id":"ord_1","status":"settled"}}`)
	changed := bytes.Replace(body, []byte("settled"), []byte("expired"), 1)
	now := time.Now()
	signed := webhook.Sign(secret, now, body)
	// A second v1 signature beside the right one, as during a rotation.
	rotated := signed + ",v1=" + strings.Repeat("ab", 32)
	type check struct {
		name   string
		secret string
		header string
		body   []byte
		want   bool
	}
	cases := []check{
		{"a body signed now", secret, signed, body, true},
		{"a body signed 4 minutes ago", secret, webhook.Sign(secret, now.Add(-4*time.Minute), body), body, true},
		{"two v1 signatures, one matching", secret, rotated, body, true},
		{"a changed body", secret, signed, changed, false},
		{"a wrong secret", "whsec_wrong", signed, body, false},
		{"a stale timestamp (10 minutes old)", secret, webhook.Sign(secret, now.Add(-10*time.Minute), body), body, false},
		{"a timestamp 10 minutes ahead", secret, webhook.Sign(secret, now.Add(10*time.Minute), body), body, false},
		{"no header", secret, "", body, false},
	}
	type input struct {
		Secret string `json:"secret"`
		Header string `json:"header"`
		Body   string `json:"body"`
	}
	in := make([]input, len(cases))
	for i, c := range cases {
		in[i] = input{Secret: base64.StdEncoding.EncodeToString([]byte(c.secret)), Header: c.header,
			Body: base64.StdEncoding.EncodeToString(c.body)}
		// The Go package decides the same way (the README calls this the
		// same check).
		if got := webhook.Verify(c.secret, c.header, c.body, 5*time.Minute) == nil; got != c.want {
			t.Fatalf("%s: webhook.Verify accepts = %v, want %v", c.name, got, c.want)
		}
	}
	driver := `
import base64, json, sys
cases = json.load(sys.stdin)
print(json.dumps([bool(verify(base64.b64decode(c["secret"]), c["header"], base64.b64decode(c["body"]))) for c in cases]))
`
	script := filepath.Join(t.TempDir(), "verify.py")
	if err := os.WriteFile(script, []byte(readmePython(t)+driver), 0o600); err != nil {
		t.Fatal(err)
	}
	stdin, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, script)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("README.md's Python snippet did not run: %v\n%s", err, stderr.String())
	}
	var got []bool
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(cases) {
		t.Fatalf("unexpected output of README.md's Python snippet (%v): %s", err, out)
	}
	for i, c := range cases {
		if got[i] != c.want {
			t.Errorf("README.md's Python verify on %s returned %v, want %v", c.name, got[i], c.want)
		}
	}
}
