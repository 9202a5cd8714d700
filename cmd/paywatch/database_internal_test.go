package main

import (
	"strings"
	"testing"
)

// A database URL or DSN in a message or a log line never shows its
// password, wherever it is given.
func TestRedactHidesEveryFormOfPassword(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		{"postgres://shop:s3cret@db:5432/paywatch?sslmode=disable", "postgres://shop:xxxxx@db:5432/paywatch?sslmode=disable"},
		{"postgres://shop@db/paywatch?password=s3cret&sslmode=disable", "postgres://shop@db/paywatch?password=xxxxx&sslmode=disable"},
		{"host=db user=shop password=s3cret dbname=paywatch", "host=db user=shop password=xxxxx dbname=paywatch"},
		{"host=db password = 's3 cr\\'et' dbname=paywatch", "host=db password = xxxxx dbname=paywatch"},
		{"postgres://shop@db/paywatch", "postgres://shop@db/paywatch"},
	} {
		got := redact(c.dsn)
		if got != c.want || strings.Contains(got, "s3") {
			t.Errorf("redact(%q) = %q, want %q", c.dsn, got, c.want)
		}
	}
}

// Each pool names its sessions with a fallback_application_name, in both
// forms of DSN, and leaves a name the operator gave alone.
func TestNamedGivesAFallbackName(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		{"postgres://shop@db/paywatch?sslmode=disable", "postgres://shop@db/paywatch?fallback_application_name=paywatch-api&sslmode=disable"},
		{"postgres://shop@db/paywatch?application_name=mine", "postgres://shop@db/paywatch?application_name=mine&fallback_application_name=paywatch-api"},
		{"host=db dbname=paywatch ", "host=db dbname=paywatch fallback_application_name=paywatch-api"},
		{"host=db fallback_application_name=mine", "host=db fallback_application_name=mine"},
	} {
		if got := named(c.dsn, "paywatch-api"); got != c.want {
			t.Errorf("named(%q) = %q, want %q", c.dsn, got, c.want)
		}
	}
}
