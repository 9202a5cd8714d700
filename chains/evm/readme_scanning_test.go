package evm_test

import (
	"slices"
	"testing"
)

// "… halved when a node refuses a range with -32005 …": a node that refuses
// wide eth_getLogs with the -32005 code and words that name neither a
// range nor a limit has the range halved, step after step, and every
// payment is found; no step fails on the refusal.
func TestRangeRefusedWithCode32005IsHalved(t *testing.T) {
	e := newEnv(t)
	e.withoutNative()
	front := newRPCFront(t, e.chain.URL)
	front.refusal = `{"code":-32005,"message":"request rejected"}`
	front.refuseOver.Store(40)
	e.network.RPCURLs = []string{front.URL}
	e.network.StartBlock = e.chain.Head() + 1
	wants := e.sprinkle(96, 16)
	s := e.scanner()
	s.MaxBatch = 64
	stepUntilHead(t, s)
	if _, err := s.VerifyPending(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.expect(wants...)
	var refused, served []uint64 // widths of the scanner's range reads
	for _, r := range front.requests() {
		if from, to, ok := r.logRange(); ok && r.readsRange() {
			if r.Refused {
				refused = append(refused, to-from+1)
			} else {
				served = append(served, to-from+1)
			}
		}
	}
	if len(refused) == 0 || slices.Min(refused) != 64 {
		t.Fatalf("ranges refused with -32005: %v, want the largest batch (64)", refused)
	}
	if len(served) == 0 || slices.Max(served) != 32 {
		t.Fatalf("ranges read after the -32005 refusals: %v, want halved to 32", served)
	}
}
