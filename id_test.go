package paywatch

import (
	"regexp"
	"slices"
	"testing"
	"time"
)

func TestNewSortableID(t *testing.T) {
	form := regexp.MustCompile(`^trf_[a-z2-7]{24}$`)
	start := time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC)
	var ids []string
	seen := map[string]bool{}
	for i := range 2000 {
		// Milliseconds apart, a few per millisecond, and far in the future.
		at := start.Add(time.Duration(i/4) * time.Millisecond)
		if i >= 1990 {
			at = start.AddDate(300, 0, i)
		}
		id := NewSortableID("trf", at)
		if !form.MatchString(id) {
			t.Fatalf("%q has not the form of an identifier (NewID's: %q)", id, NewID("trf"))
		}
		if seen[id] {
			t.Fatalf("%q made twice", id)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	for i := 4; i < len(ids); i++ {
		if i%4 == 0 && ids[i] <= ids[i-1] {
			t.Fatalf("%q (made later) sorts before %q", ids[i], ids[i-1])
		}
	}
	// Within one millisecond the order is random: not all in the order made.
	sorted := slices.IsSorted(ids[:4]) && slices.IsSorted(ids[4:8]) && slices.IsSorted(ids[8:12]) && slices.IsSorted(ids[12:16])
	if sorted && slices.IsSorted(ids[16:20]) && slices.IsSorted(ids[20:24]) {
		t.Errorf("ids of one millisecond all came out sorted: %v", ids[:24])
	}
}

func TestNewID(t *testing.T) {
	form := regexp.MustCompile(`^ord_[a-z2-7]{24}$`)
	seen := map[string]bool{}
	for range 10_000 {
		id := NewID("ord")
		if !form.MatchString(id) || seen[id] {
			t.Fatalf("%q: not of the form, or made twice", id)
		}
		seen[id] = true
	}
}
