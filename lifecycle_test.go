package paywatch

import (
	"math/big"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

func randomFacts(r *rand.Rand) Facts {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	reasons := []Reason{"", ReasonUnderpaid, ReasonOverpaid, ReasonLatePayment, ReasonNoPaymentFound,
		ReasonMultiplePayments, ReasonOrphanedPayment, ReasonWrongAsset, ReasonAmbiguous}
	f := Facts{
		Status:    Statuses[r.IntN(len(Statuses))],
		Shared:    r.IntN(2) == 0,
		PayAmount: big.NewInt(100),
		ExpiresAt: now.Add(time.Duration(r.IntN(5)-2) * time.Hour),
		PaidGrace: 2 * time.Hour,
		Now:       now,
		Live:      r.IntN(3),
		Orphaned:  r.IntN(2),
		Late:      r.IntN(4) == 0,
	}
	if f.Status == StatusDisputed {
		f.Reason = reasons[1+r.IntN(len(reasons)-1)]
	}
	if f.Live > 0 {
		f.Unconfirmed = r.IntN(f.Live + 1)
	}
	f.Received = big.NewInt(int64(f.Live) * []int64{0, 40, 50, 100, 150}[r.IntN(5)])
	if r.IntN(3) == 0 {
		m := now.Add(-time.Duration(r.IntN(4)) * time.Hour)
		f.MarkedPaidAt = &m
	}
	if r.IntN(3) == 0 {
		f.Detected = r.IntN(2)
		f.Detached = r.IntN(2)
	}
	f.DetectedAmount = big.NewInt(int64(f.Detected) * []int64{50, 100, 150}[r.IntN(3)])
	if f.Status == StatusSettled && r.IntN(3) == 0 {
		f.Accepted = big.NewInt([]int64{0, 80, 100}[r.IntN(3)])
	}
	return f
}

// Every move Decide makes is in Lifecycle, and deciding again on its result
// changes nothing (a second reconciler pass is a no-op).
func TestDecideMovesOnlyAsTheLifecycleAllows(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	seen := map[string]bool{}
	for i := 0; i < 200_000; i++ {
		f := randomFacts(r)
		to, reason := Decide(f)
		if to == StatusDisputed && reason == "" || to != StatusDisputed && reason != "" {
			t.Fatalf("Decide(%+v) = %s/%q", f, to, reason)
		}
		if to == f.Status && reason == f.Reason {
			continue
		}
		if !CanMove(f.Status, to, reason, ActorReconciler) {
			t.Fatalf("Decide moved %s/%s to %s/%s, which Lifecycle does not allow (facts %+v)", f.Status, f.Reason, to, reason, f)
		}
		seen[string(f.Status)+">"+string(to)+":"+string(reason)] = true
		g := f
		g.Status, g.Reason = to, reason
		if to2, reason2 := Decide(g); to2 != to || reason2 != reason {
			t.Fatalf("not stable: %s/%s then %s/%s (facts %+v)", to, reason, to2, reason2, f)
		}
	}
	// Every reconciler move of the table that Decide owns is reachable.
	for _, tr := range Lifecycle {
		if tr.By != ActorReconciler {
			continue
		}
		reasons := tr.Reasons
		if len(reasons) == 0 {
			reasons = []Reason{""}
		}
		for _, rs := range reasons {
			if rs == ReasonAmbiguous || rs == ReasonWrongAsset { // decided by matching and by hints
				continue
			}
			if !seen[string(tr.From)+">"+string(tr.To)+":"+string(rs)] {
				t.Errorf("no facts made Decide move %s to %s %s", tr.From, tr.To, rs)
			}
		}
	}
}

func TestDecideScenarios(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	base := Facts{Shared: true, PayAmount: big.NewInt(100), ExpiresAt: now.Add(time.Hour), PaidGrace: time.Hour,
		Now: now, Received: new(big.Int)}
	marked := now.Add(-2 * time.Hour)
	cases := []struct {
		name   string
		edit   func(*Facts)
		status Status
		reason Reason
	}{
		{"awaiting", func(f *Facts) { f.Status = StatusAwaitingPayment }, StatusAwaitingPayment, ""},
		{"expired", func(f *Facts) { f.Status, f.ExpiresAt = StatusAwaitingPayment, now }, StatusExpired, ""},
		{"no payment found", func(f *Facts) { f.Status, f.MarkedPaidAt = StatusAwaitingPayment, &marked }, StatusDisputed, ReasonNoPaymentFound},
		{"exact, confirmed", func(f *Facts) {
			f.Status, f.Live, f.Received = StatusConfirming, 1, big.NewInt(100)
		}, StatusSettled, ""},
		{"exact but late after no_payment_found", func(f *Facts) {
			f.Status, f.Reason, f.Live, f.Received, f.Late = StatusDisputed, ReasonNoPaymentFound, 1, big.NewInt(100), true
		}, StatusDisputed, ReasonLatePayment},
		{"found after expiry, paid in time", func(f *Facts) {
			f.Status, f.ExpiresAt, f.Live, f.Received = StatusExpired, now.Add(-30*time.Hour), 1, big.NewInt(100)
		}, StatusSettled, ""},
		{"settled, part orphaned", func(f *Facts) {
			f.Status, f.Shared, f.ExpiresAt, f.Live, f.Orphaned, f.Received = StatusSettled, false, now.Add(-time.Hour), 1, 1, big.NewInt(60)
		}, StatusDisputed, ReasonUnderpaid},
		{"settled, part orphaned before expiry", func(f *Facts) {
			f.Status, f.Shared, f.Live, f.Orphaned, f.Received = StatusSettled, false, 1, 1, big.NewInt(60)
		}, StatusConfirming, ""},
		{"settled, all orphaned", func(f *Facts) { f.Status, f.Orphaned = StatusSettled, 2 }, StatusDisputed, ReasonOrphanedPayment},
		{"underpaid, all orphaned", func(f *Facts) {
			f.Status, f.Reason, f.Orphaned = StatusDisputed, ReasonUnderpaid, 1
		}, StatusDisputed, ReasonOrphanedPayment},
		{"orphaned parts all back", func(f *Facts) {
			f.Status, f.Reason, f.Shared, f.Live, f.Received = StatusDisputed, ReasonUnderpaid, false, 2, big.NewInt(100)
		}, StatusSettled, ""},
		{"settled, moved below confirmations", func(f *Facts) {
			f.Status, f.Live, f.Unconfirmed, f.Received = StatusSettled, 1, 1, big.NewInt(100)
		}, StatusConfirming, ""},
		{"disputed waits for confirmations", func(f *Facts) {
			f.Status, f.Reason, f.Live, f.Unconfirmed, f.Received = StatusDisputed, ReasonUnderpaid, 2, 1, big.NewInt(100)
		}, StatusDisputed, ReasonUnderpaid},
		{"operator accepted a shortfall", func(f *Facts) {
			f.Status, f.Accepted, f.Live, f.Received, f.Late = StatusSettled, big.NewInt(90), 1, big.NewInt(90), true
		}, StatusSettled, ""},
		{"operator accepted, the payment is gone", func(f *Facts) {
			f.Status, f.Accepted, f.Orphaned = StatusSettled, big.NewInt(90), 1
		}, StatusDisputed, ReasonOrphanedPayment},
		{"operator settled with nothing received", func(f *Facts) {
			f.Status, f.Accepted, f.Orphaned = StatusSettled, new(big.Int), 1
		}, StatusSettled, ""},
		{"confirming, its payment mined again before the order existed", func(f *Facts) {
			f.Status, f.Detached = StatusConfirming, 1
		}, StatusDisputed, ReasonOrphanedPayment},
		{"refunded stays refunded", func(f *Facts) { f.Status, f.Orphaned = StatusRefunded, 1 }, StatusRefunded, ""},
		{"payment detected in the mempool", func(f *Facts) {
			f.Status, f.Detected, f.DetectedAmount = StatusAwaitingPayment, 1, big.NewInt(100)
		}, StatusConfirming, ""},
		{"part of the amount detected: not yet", func(f *Facts) {
			f.Status, f.Detected, f.DetectedAmount = StatusAwaitingPayment, 1, big.NewInt(99)
		}, StatusAwaitingPayment, ""},
		{"detected, past expiry: a sighting holds it no longer", func(f *Facts) {
			f.Status, f.Detected, f.DetectedAmount, f.ExpiresAt = StatusConfirming, 1, big.NewInt(100), now.Add(-time.Hour)
		}, StatusExpired, ""},
		{"detected, marked paid long ago, past expiry", func(f *Facts) {
			f.Status, f.Detected, f.DetectedAmount, f.ExpiresAt, f.MarkedPaidAt = StatusConfirming, 1, big.NewInt(100), now.Add(-time.Hour), &marked
		}, StatusDisputed, ReasonNoPaymentFound},
		{"detected after expiry does not revive an expired order", func(f *Facts) {
			f.Status, f.Detected, f.DetectedAmount, f.ExpiresAt = StatusExpired, 1, big.NewInt(100), now.Add(-time.Hour)
		}, StatusExpired, ""},
		{"detected, then replaced", func(f *Facts) { f.Status = StatusConfirming }, StatusAwaitingPayment, ""},
		{"detected, replaced, past expiry", func(f *Facts) {
			f.Status, f.ExpiresAt = StatusConfirming, now.Add(-time.Hour)
		}, StatusExpired, ""},
		{"settled, its payment back in the mempool after a reorg", func(f *Facts) {
			f.Status, f.Orphaned, f.Detected, f.DetectedAmount = StatusSettled, 1, 1, big.NewInt(100)
		}, StatusConfirming, ""},
		{"confirming, its payment mined where it cannot pay it: taken away, not withdrawn", func(f *Facts) {
			f.Status, f.Detached, f.Detected, f.DetectedAmount = StatusConfirming, 1, 1, big.NewInt(5)
		}, StatusDisputed, ReasonOrphanedPayment},
		{"mined and orphaned, the mempool copy replaced", func(f *Facts) {
			f.Status, f.Orphaned = StatusConfirming, 1
		}, StatusDisputed, ReasonOrphanedPayment},
		{"operator accepted a part; its payment back in the mempool", func(f *Facts) {
			f.Status, f.Accepted, f.Orphaned, f.Detected, f.DetectedAmount = StatusSettled, big.NewInt(90), 1, 1, big.NewInt(90)
		}, StatusConfirming, ""},
		{"detected never settles a dispute", func(f *Facts) {
			f.Status, f.Reason, f.Detected, f.DetectedAmount = StatusDisputed, ReasonNoPaymentFound, 1, big.NewInt(100)
		}, StatusDisputed, ReasonNoPaymentFound},
		{"two exact payments to a shared address", func(f *Facts) {
			f.Status, f.Live, f.Received = StatusConfirming, 2, big.NewInt(200)
		}, StatusDisputed, ReasonMultiplePayments},
	}
	for _, c := range cases {
		f := base
		c.edit(&f)
		if s, r := Decide(f); s != c.status || r != c.reason {
			t.Errorf("%s: %s/%s, want %s/%s", c.name, s, r, c.status, c.reason)
		}
	}
}

// README's table of transitions is Lifecycle, rendered. With
// PAYWATCH_UPDATE_README=1 the test writes it there.
func TestREADMEShowsTheLifecycle(t *testing.T) {
	raw, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme, table := string(raw), LifecycleTable()
	if strings.Contains(readme, table) {
		return
	}
	header := table[:strings.Index(table, "\n")+1]
	start := strings.Index(readme, header)
	if os.Getenv("PAYWATCH_UPDATE_README") == "" || start < 0 {
		t.Fatalf("README.md does not hold the lifecycle table; run with PAYWATCH_UPDATE_README=1, or paste this:\n%s", table)
	}
	end := start + strings.Index(readme[start:], "\n\n") + 1
	if err := os.WriteFile("README.md", []byte(readme[:start]+table+readme[end:]), 0o644); err != nil {
		t.Fatal(err)
	}
}
