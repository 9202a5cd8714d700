package paywatch_test

import (
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/paywatch/paywatch"
)

func TestParseUnitsRejects(t *testing.T) {
	max := big.NewInt(1_000_000_000) // 1000 USDT
	cases := []struct{ in, want string }{
		{"", "empty"},
		{"-1", "negative"},
		{"0", "greater than zero"},
		{"0.000000", "greater than zero"},
		{"1e6", "exponent"},
		{"1E-2", "exponent"},
		{"1.0000001", "amount has 7 decimals; USDT allows 6"},
		{"NaN", "not a plain decimal"},
		{"Infinity", "not a plain decimal"},
		{" 1", "not a plain decimal"},
		{"1 ", "not a plain decimal"},
		{"+1", "not a plain decimal"},
		{".5", "not a plain decimal"},
		{"5.", "not a plain decimal"},
		{"1.2.3", "not a plain decimal"},
		{"0x10", "not a plain decimal"},
		{"1,5", "not a plain decimal"},
		{"１", "not a plain decimal"}, // full-width digit
		{"1000.000001", "exceeds the maximum of 1000 USDT"},
		{strings.Repeat("9", 101), "too long"},
	}
	for _, c := range cases {
		_, err := paywatch.ParseUnits(c.in, 6, "USDT", max)
		if err == nil {
			t.Errorf("ParseUnits(%q) accepted", c.in)
			continue
		}
		if paywatch.ErrorCode(err) != paywatch.CodeInvalidAmount {
			t.Errorf("ParseUnits(%q) code %s", c.in, paywatch.ErrorCode(err))
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseUnits(%q) = %q, want it to mention %q", c.in, err, c.want)
		}
	}
}

func TestParseUnitsAccepts(t *testing.T) {
	cases := []struct {
		in       string
		decimals int32
		want     string
	}{
		{"1234.00", 6, "1234000000"},
		{"1234.000317", 6, "1234000317"},
		{"0.000001", 6, "1"},
		{"007", 2, "700"},
		{"1", 0, "1"},
		{"0.000000000000000001", 18, "1"},
		{"115792089237316195423570985008687907853269984665640564039457.584007913129639935", 18,
			"115792089237316195423570985008687907853269984665640564039457584007913129639935"},
	}
	for _, c := range cases {
		max := new(big.Int).Exp(big.NewInt(2), big.NewInt(256), nil)
		got, err := paywatch.ParseUnits(c.in, c.decimals, "X", max)
		if err != nil {
			t.Errorf("ParseUnits(%q): %v", c.in, err)
			continue
		}
		if got.String() != c.want {
			t.Errorf("ParseUnits(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}

func TestParseUnitsDefaultMax(t *testing.T) {
	over := new(big.Int).Add(paywatch.MaxUnits, big.NewInt(1))
	if _, err := paywatch.ParseUnits(over.String(), 0, "X", nil); err == nil {
		t.Fatal("amount over MaxUnits accepted")
	}
	if _, err := paywatch.ParseUnits(paywatch.MaxUnits.String(), 0, "X", nil); err != nil {
		t.Fatalf("MaxUnits rejected: %v", err)
	}
}

// canonical renders units the way a careful person writes an amount: no
// leading zeros, no trailing fractional zeros.
func canonical(units *big.Int, decimals int32) string {
	s := units.String()
	if decimals == 0 {
		return s
	}
	if len(s) <= int(decimals) {
		s = strings.Repeat("0", int(decimals)-len(s)+1) + s
	}
	i := len(s) - int(decimals)
	frac := strings.TrimRight(s[i:], "0")
	if frac == "" {
		return s[:i]
	}
	return s[:i] + "." + frac
}

func randomUnits(r *rand.Rand) *big.Int {
	// Random magnitudes from 1 to ~10^40, biased to small and round values.
	digits := 1 + r.IntN(40)
	var b strings.Builder
	b.WriteByte(byte('1' + r.IntN(9)))
	for i := 1; i < digits; i++ {
		if r.IntN(3) == 0 {
			b.WriteByte('0')
		} else {
			b.WriteByte(byte('0' + r.IntN(10)))
		}
	}
	u, _ := new(big.Int).SetString(b.String(), 10)
	return u
}

func TestUnitsRoundTripProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, decimals := range []int32{0, 2, 6, 8, 18} {
		for i := 0; i < 5000; i++ {
			units := randomUnits(r)
			s := paywatch.FormatUnits(units, decimals)
			if want := canonical(units, decimals); s != want {
				t.Fatalf("FormatUnits(%s, %d) = %q, want %q", units, decimals, s, want)
			}
			back, err := paywatch.ParseUnits(s, decimals, "X", nil)
			if err != nil {
				t.Fatalf("ParseUnits(%q, %d): %v", s, decimals, err)
			}
			if back.Cmp(units) != 0 {
				t.Fatalf("units → %q → %s, want %s", s, back, units)
			}
			// and string → units → string is the identity on canonical input
			if again := paywatch.FormatUnits(back, decimals); again != s {
				t.Fatalf("%q → %s → %q", s, back, again)
			}
		}
	}
}

func TestParseStep(t *testing.T) {
	if u, err := paywatch.ParseStep("0.000001", 6, "USDT"); err != nil || u.Int64() != 1 {
		t.Fatalf("ParseStep = %v, %v", u, err)
	}
	if u, err := paywatch.ParseStep("0.0100", 2, "EUR"); err != nil || u.Int64() != 1 {
		t.Fatalf("ParseStep trailing zeros = %v, %v", u, err)
	}
	if _, err := paywatch.ParseStep("0.0000001", 6, "USDT"); err == nil || !strings.Contains(err.Error(), "finer than the base unit") {
		t.Fatalf("ParseStep finer than base unit: %v", err)
	}
	if _, err := paywatch.ParseStep("0", 6, "USDT"); err == nil {
		t.Fatal("zero step accepted")
	}
}

func FuzzParseUnits(f *testing.F) {
	for _, s := range []string{"1", "0.1", "1234.000317", "-1", "1e5", "", ".", "00.10", "9999999999999999999999999999"} {
		f.Add(s, uint8(6))
	}
	f.Fuzz(func(t *testing.T, s string, d uint8) {
		decimals := int32(d % 40)
		units, err := paywatch.ParseUnits(s, decimals, "X", nil)
		if err != nil {
			if paywatch.ErrorCode(err) != paywatch.CodeInvalidAmount {
				t.Fatalf("ParseUnits(%q) error with code %s", s, paywatch.ErrorCode(err))
			}
			return
		}
		if units.Sign() <= 0 || units.Cmp(paywatch.MaxUnits) > 0 {
			t.Fatalf("ParseUnits(%q) = %s out of range", s, units)
		}
		back, err := paywatch.ParseUnits(paywatch.FormatUnits(units, decimals), decimals, "X", nil)
		if err != nil || back.Cmp(units) != 0 {
			t.Fatalf("round trip of %q: %v %v", s, back, err)
		}
	})
}
