package orders

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/paywatch/paywatch/migrations/pgtest"
	"github.com/paywatch/paywatch/reconcile/reconciletest"
)

// The look-ups that find an earlier creation (by Idempotency-Key, by
// external_id) run again on another connection when theirs had died while
// idle: a storefront's retry is answered with its order, not an error.
func TestReplayLooksUpAgainAfterItsConnectionDied(t *testing.T) {
	ctx := context.Background()
	_, dbURL := pgtest.NewWithURL(t)
	const pooled = 3
	p, db := pgtest.ProxiedPool(t, dbURL, pooled)
	fx := reconciletest.NewFixtures()
	s := NewStore(db, 24*time.Hour, reconciletest.Wallets(t))
	for _, req := range []CreateRequest{
		{ExternalID: "replay-1", Network: fx.Ethereum, Asset: fx.USDT, Amount: big.NewInt(5_000_000), ExpiresIn: time.Hour,
			Actor: "storefront"},
		{ExternalID: "replay-2", IdempotencyKey: "key-2", IdempotencyScope: "storefront", Network: fx.Ethereum, Asset: fx.USDT,
			Amount: big.NewInt(6_000_000), ExpiresIn: time.Hour, Actor: "storefront"},
	} {
		o, created, err := s.Create(ctx, req)
		if err != nil || !created {
			t.Fatalf("%s: %v %v", req.ExternalID, created, err)
		}
		hash, err := req.hash()
		if err != nil {
			t.Fatal(err)
		}
		pgtest.FillPool(t, db, pooled)
		p.Reset()
		got, err := s.replay(ctx, &req, hash)
		if err != nil || got == nil || got.ID != o.ID {
			t.Fatalf("%s: the replay after the connections died: %v, %v; want %s", req.ExternalID, got, err, o.ID)
		}
	}
}
