package evm

import (
	"strings"
	"testing"
)

func TestParseAddress(t *testing.T) {
	const sum = "0xdAC17F958D2ee523a2206206994597C13D831ec7"
	for _, in := range []string{sum, strings.ToLower(sum), "0x" + strings.ToUpper(sum[2:])} {
		got, err := ParseAddress(in)
		if err != nil || got != sum {
			t.Errorf("ParseAddress(%s) = %s, %v", in, got, err)
		}
	}
	bad := []struct{ in, want string }{
		{"0xdAC17F958D2ee523a2206206994597C13D831Ec7", "checksum"},
		{"0xdAC17F958D2ee523a2206206994597C13D831ec", "malformed"},
		{"dAC17F958D2ee523a2206206994597C13D831ec7", "malformed"},
		{"0xgAC17F958D2ee523a2206206994597C13D831ec7", "malformed"},
		{"", "malformed"},
	}
	for _, c := range bad {
		if _, err := ParseAddress(c.in); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseAddress(%q) = %v, want %q", c.in, err, c.want)
		}
	}
}

func TestValidTxHash(t *testing.T) {
	if !ValidTxHash("0x" + strings.Repeat("ab", 32)) {
		t.Fatal("valid hash rejected")
	}
	for _, s := range []string{strings.Repeat("ab", 32), "0x" + strings.Repeat("ab", 31), "0x" + strings.Repeat("zz", 32)} {
		if ValidTxHash(s) {
			t.Errorf("ValidTxHash(%q) = true", s)
		}
	}
}

func FuzzParseAddress(f *testing.F) {
	f.Add("0xdAC17F958D2ee523a2206206994597C13D831ec7")
	f.Add("0x")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseAddress(s)
		if err != nil {
			return
		}
		again, err := ParseAddress(got)
		if err != nil || again != got {
			t.Fatalf("checksummed form %s does not parse to itself: %v", got, err)
		}
	})
}
