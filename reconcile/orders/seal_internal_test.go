package orders

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/paywatch/paywatch/reconcile/webhook"
)

// A webhook body is written without json.Marshal of the event: it must be
// what json.Marshal makes of it, byte for byte, whatever the id, type,
// time and view.
func TestAppendEventIsWhatJSONMarshalMakes(t *testing.T) {
	east := time.FixedZone("east", 5*3600+30*60)
	for _, c := range []struct {
		id, typ string
		at      time.Time
		view    string
	}{
		{"evt_0123abcd", "order.settled", time.Date(2026, 11, 30, 23, 59, 59, 123456000, time.UTC), `{"id":"ord_1","amount":"12.5"}`},
		{"evt_x", "order.disputed", time.Date(2026, 1, 2, 3, 4, 5, 0, east), `{}`},
		{`evt_<&>"\é` + "\u2028\x01", "order.<b>", time.Date(1999, 12, 31, 0, 0, 0, 1, time.UTC), `{"a":[1,2,{"b":null}],"c":"\u003c"}`},
	} {
		want, err := json.Marshal(webhook.Event{ID: c.id, Type: c.typ, CreatedAt: c.at.UTC(), Order: json.RawMessage(c.view)})
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendEvent([]byte("prefix"), c.id, c.typ, c.at, json.RawMessage(c.view))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "prefix"+string(want) {
			t.Errorf("appendEvent:\n got %s\nwant prefix%s", got, want)
		}
	}
	if _, err := appendEvent(nil, "evt_y", "order.settled", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), json.RawMessage(`{}`)); err == nil {
		t.Error("a time json.Marshal refuses was written")
	}
}
