package bitcoin

import (
	"context"
	"errors"
	"testing"
)

// givenBook is an order store in memory: addresses handed out in order.
type givenBook struct {
	d    *Deriver
	next uint32
}

func (g *givenBook) Given(_ context.Context, _ string, from uint32, limit int) ([]string, uint32, error) {
	var out []string
	for i := from; i < g.next && len(out) < limit; i++ {
		a, err := g.d.Address(i)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, a)
	}
	return out, g.next, nil
}

// The watch set holds every address handed out and Lookahead more; a
// burst of orders past the lookahead while blocks were read is caught, so
// the blocks are read again rather than a payment missed.
func TestWatchSetCoversWhatWasHandedOut(t *testing.T) {
	const vpub = "vpub5Y6cjg78GGuNLsaPhmYsiw4gYX3HoQiRBiSwDaBXKUafCt9bNwWQiitDk5VZ5BVxYnQdwoTyXSs2JHRPAgjAvtbBrf8ZhDYe2jWAqvZVnsc"
	d, err := NewDeriver(vpub, "regtest", "")
	if err != nil {
		t.Fatal(err)
	}
	book := &givenBook{d: d, next: 7}
	w, err := NewWatchSet("regtest", nil, map[string]*Deriver{vpub: d}, book)
	if err != nil {
		t.Fatal(err)
	}
	w.Lookahead = 3
	ctx := context.Background()
	if err := w.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if w.Len() != 10 {
		t.Fatalf("%d scripts watched, want 7 handed out and 3 ahead", w.Len())
	}
	cov := w.coverage()
	book.next = 10 // within the lookahead
	if err := w.checkCovered(ctx, cov); err != nil {
		t.Fatalf("orders within the lookahead: %v", err)
	}
	book.next = 11 // one past it
	if err := w.checkCovered(ctx, cov); !errors.Is(err, errOutgrown) {
		t.Fatalf("an order past the lookahead: %v", err)
	}
	if err := w.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.checkCovered(ctx, w.coverage()); err != nil || w.Len() != 14 {
		t.Fatalf("after a refresh: %d scripts (%v)", w.Len(), err)
	}
}
