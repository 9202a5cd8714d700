package orders

import (
	"bytes"
	"context"
	"crypto/rand"
	"math/big"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// payamountEntropy is a byte stream that counts what is read from it.
type payamountEntropy struct {
	src  *bytes.Reader
	read int
}

func (e *payamountEntropy) Read(p []byte) (int, error) {
	n, err := e.src.Read(p)
	e.read += n
	return n, err
}

// payamountStream is the bytes the draw is given: the same 16 bytes over
// and over, enough for any draw below.
func payamountStream() []byte {
	return bytes.Repeat([]byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x0f, 0xed, 0xcb, 0xa9, 0x87, 0x65, 0x43, 0x21}, 64)
}

// README ("Pay amounts and addresses"): on a shared address, "pay_amount =
// amount + k × unique_step with a k no other order holds ..., drawn at
// random among the free ones (cryptographic randomness)". A store reads
// its draws from crypto/rand.Reader; the k of an order is the one the
// bytes it read call for, among the 10,000 slots (the default
// unique_slots).
func TestPayAmountsAreDrawnWithCryptographicRandomness(t *testing.T) {
	fx := reconciletest.NewFixtures()
	fx.USDT.UniqueSlots = 10_000
	s := NewStore(pgtest.New(t), 24*time.Hour, reconciletest.Wallets(t))
	if s.entropy != rand.Reader {
		t.Fatalf("a new store draws pay amounts from %T, want crypto/rand.Reader", s.entropy)
	}
	src := &payamountEntropy{src: bytes.NewReader(payamountStream())}
	s.entropy = src
	want, err := rand.Int(bytes.NewReader(payamountStream()), big.NewInt(10_000))
	if err != nil {
		t.Fatal(err)
	}
	if want.Sign() == 0 {
		t.Fatal("the test's bytes call for k = 0, which tells nothing; change them")
	}
	o, _, err := s.Create(context.Background(), CreateRequest{ExternalID: "draw-1", Network: fx.Ethereum, Asset: fx.USDT,
		Amount: big.NewInt(5_000_000), ExpiresIn: time.Hour, Actor: "storefront"})
	if err != nil {
		t.Fatal(err)
	}
	if src.read == 0 {
		t.Fatal("the order's pay amount was drawn without reading the store's random source")
	}
	if k := new(big.Int).Sub(o.PayAmount, big.NewInt(5_000_000)); k.Cmp(want) != 0 {
		t.Fatalf("the order's k is %s, want %s: what the random source's bytes call for among 10,000 slots", k, want)
	}
}
