package paywatch

import (
	"math/big"
	"strings"

	"github.com/shopspring/decimal"
)

// MaxDecimals is the largest number of decimals an asset may have.
const MaxDecimals = 36

// maxAmountDigits bounds the text of an amount before any arithmetic, so
// that a hostile string cannot make parsing expensive.
const maxAmountDigits = 100

// MaxUnits is the largest amount in base units that paywatch stores: it
// keeps amount plus the unique increment inside PostgreSQL's NUMERIC(78,0)
// and inside uint256.
var MaxUnits = new(big.Int).Sub(new(big.Int).Exp(big.NewInt(10), big.NewInt(76), nil), big.NewInt(1))

// ParseUnits converts a decimal string in an asset's units ("1234.000317")
// into base units. It accepts only plain decimal notation: digits, at most
// one dot with digits on both sides; no sign, exponent, spaces or NaN. The
// amount must be positive, have at most decimals fractional digits and not
// exceed max (nil means MaxUnits). what names the amount in messages.
func ParseUnits(s string, decimals int32, symbol string, max *big.Int) (*big.Int, error) {
	if err := checkDecimalSyntax(s); err != nil {
		return nil, err
	}
	intPart, frac, _ := strings.Cut(s, ".")
	if len(frac) > int(decimals) {
		return nil, Errorf(CodeInvalidAmount, "amount has %d decimals; %s allows %d", len(frac), symbol, decimals)
	}
	digits := intPart + frac + strings.Repeat("0", int(decimals)-len(frac))
	units, ok := new(big.Int).SetString(digits, 10)
	if !ok {
		return nil, Errorf(CodeInvalidAmount, "amount %q is not a decimal number", s)
	}
	if units.Sign() <= 0 {
		return nil, Errorf(CodeInvalidAmount, "amount must be greater than zero")
	}
	if max == nil {
		max = MaxUnits
	}
	if units.Cmp(max) > 0 {
		return nil, Errorf(CodeInvalidAmount, "amount exceeds the maximum of %s %s", FormatUnits(max, decimals), symbol)
	}
	return units, nil
}

func checkDecimalSyntax(s string) error {
	if s == "" {
		return Errorf(CodeInvalidAmount, "amount is empty")
	}
	if len(s) > maxAmountDigits {
		return Errorf(CodeInvalidAmount, "amount is too long")
	}
	if s[0] == '-' {
		return Errorf(CodeInvalidAmount, "amount must not be negative")
	}
	dots := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
		case c == '.':
			dots++
			if dots > 1 || i == 0 || i == len(s)-1 {
				return Errorf(CodeInvalidAmount, "amount %q is not a plain decimal number", s)
			}
		case c == 'e' || c == 'E':
			return Errorf(CodeInvalidAmount, "amount %q uses exponent notation; write it out in full", s)
		default:
			return Errorf(CodeInvalidAmount, "amount %q is not a plain decimal number", s)
		}
	}
	return nil
}

// FormatUnits renders base units as a decimal string in the asset's units,
// without trailing fractional zeros ("1234.5", "0.000001", "7").
func FormatUnits(units *big.Int, decimals int32) string {
	if units == nil {
		return "0"
	}
	return decimal.NewFromBigInt(units, -decimals).String()
}

// ParseStep converts a positive increment such as unique_step ("0.000001")
// into base units. It fails when the step is finer than one base unit.
func ParseStep(s string, decimals int32, symbol string) (*big.Int, error) {
	if err := checkDecimalSyntax(s); err != nil {
		return nil, err
	}
	_, frac, _ := strings.Cut(s, ".")
	if trimmed := strings.TrimRight(frac, "0"); len(trimmed) > int(decimals) {
		return nil, Errorf(CodeInvalidAmount, "step %s is finer than the base unit of %s (%d decimals)", s, symbol, decimals)
	}
	d, err := decimal.NewFromString(s)
	if err != nil {
		return nil, Errorf(CodeInvalidAmount, "step %q is not a decimal number", s)
	}
	units := d.Shift(decimals).BigInt()
	if units.Sign() <= 0 {
		return nil, Errorf(CodeInvalidAmount, "step must be greater than zero")
	}
	return units, nil
}
