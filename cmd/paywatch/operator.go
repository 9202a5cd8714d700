package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
)

// The operator commands talk to a running daemon's API with an operator
// key (PAYWATCH_API_KEY), print tables for people and --json for scripts,
// and exit 1 on an error the API answers, 2 on a usage error.

const operatorUsage = `Operator commands (they talk to a running daemon's API):
  paywatch orders list [--status S] [--network N] [--external-id X] [--limit N] [--cursor C]
  paywatch orders show ORDER_ID            the dossier and its timeline
  paywatch transfers list [--unmatched] [--state S] [--network N] [--asset A] [--limit N] [--cursor C]
  paywatch transfers show TRANSFER_ID
  paywatch transfers attach TRANSFER_ID --order ORDER_ID --note TEXT
  paywatch resolve ORDER_ID --outcome settled|refunded|cancelled --note TEXT
  paywatch webhooks list [--order ORDER_ID] [--event EVENT_ID] [--status S] [--limit N] [--cursor C]
  paywatch webhooks redeliver EVENT_ID
  paywatch networks

Every command takes --api URL (default $PAYWATCH_API, else http://127.0.0.1:8080)
and --json (print the API's answer as it is). The key is read from $PAYWATCH_API_KEY.
`

// opClient calls the API for an operator command.
type opClient struct {
	api  string
	key  string
	json bool
	out  io.Writer
}

// opFlags parses an operator command's flags (its own, added by define,
// and the common --api and --json); it returns the positional arguments.
func opFlags(e *env, name string, args []string, define func(fs *flag.FlagSet)) (*opClient, []string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage of paywatch %s:\n", name)
		fs.PrintDefaults()
		fmt.Fprint(e.stderr, "\n"+operatorUsage)
	}
	api := e.getenv("PAYWATCH_API")
	if api == "" {
		api = "http://127.0.0.1:8080"
	}
	c := &opClient{out: e.stdout}
	fs.StringVar(&c.api, "api", api, "the daemon's API address")
	fs.BoolVar(&c.json, "json", false, "print JSON instead of a table")
	if define != nil {
		define(fs)
	}
	// Positional arguments may come before or after the flags.
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, nil, usageError{err}
		}
		args = fs.Args()
		if len(args) > 0 {
			pos, args = append(pos, args[0]), args[1:]
		}
	}
	c.api = strings.TrimRight(c.api, "/")
	if u, err := url.Parse(c.api); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, nil, usageError{fmt.Errorf("--api %q is not an http(s) URL", c.api)}
	}
	c.key = e.getenv("PAYWATCH_API_KEY")
	if c.key == "" {
		return nil, nil, usageError{errors.New("set PAYWATCH_API_KEY to an operator key")}
	}
	return c, pos, nil
}

// call sends a request and decodes the answer into v, or with --json
// prints it as it is; an error answer becomes an error with the API's code
// and message.
func (c *opClient) call(ctx context.Context, method, path string, body any, v any) error {
	raw, err := c.raw(ctx, method, path, body)
	if err != nil {
		return err
	}
	if c.json {
		_, err := fmt.Fprintln(c.out, strings.TrimSpace(string(raw)))
		return err
	}
	return json.Unmarshal(raw, v)
}

// raw sends a request and returns the answer's body.
func (c *opClient) raw(ctx context.Context, method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = strings.NewReader(string(raw))
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.api+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("is the daemon running? %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil && e.Error.Code != "" {
			return nil, fmt.Errorf("%s: %s", e.Error.Code, e.Error.Message)
		}
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	return raw, nil
}

// table prints rows under a header, aligned.
func (c *opClient) table(header []string, rows [][]string) {
	w := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(w, strings.Join(r, "\t"))
	}
	w.Flush()
}

// next prints where the following page starts, if there is one.
func (c *opClient) next(cursor *string) {
	if cursor != nil {
		fmt.Fprintf(c.out, "more: --cursor %s\n", *cursor)
	}
}

// str renders a JSON value for a table cell.
func str(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case string:
		return printable(x)
	case float64:
		return fmt.Sprint(int64(x))
	case []any:
		parts := make([]string, len(x))
		for i, p := range x {
			parts[i] = str(p)
		}
		if len(parts) == 0 {
			return "-"
		}
		return strings.Join(parts, ",")
	default:
		raw, _ := json.Marshal(x)
		return printable(string(raw))
	}
}

// printable replaces control characters (newlines, tabs, terminal escape
// sequences) with spaces: cells may hold text from outside (a webhook
// receiver's error, a customer's metadata) that must not forge rows or
// drive the terminal.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// when shortens an RFC 3339 time for a table.
func when(v any) string {
	s, _ := v.(string)
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return str(v)
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

type page struct {
	Data       []map[string]any `json:"data"`
	NextCursor *string          `json:"next_cursor"`
}

// query builds a query string from the flags that were set.
func query(params map[string]string) string {
	q := url.Values{}
	for k, v := range params {
		if v != "" {
			q.Set(k, v)
		}
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

func ordersCommand(ctx context.Context, e *env, args []string) error {
	sub, args := subcommand(args)
	if helpAsked(e, sub) {
		return nil
	}
	switch sub {
	case "list":
		var status, network, ext, limit, cursor string
		c, pos, err := opFlags(e, "orders list", args, func(fs *flag.FlagSet) {
			fs.StringVar(&status, "status", "", "only orders with this status")
			fs.StringVar(&network, "network", "", "only orders on this network")
			fs.StringVar(&ext, "external-id", "", "the order with this external id")
			fs.StringVar(&limit, "limit", "", "orders per page (1-500, default 50)")
			fs.StringVar(&cursor, "cursor", "", "where the page starts (from a previous page)")
		})
		if err != nil {
			return err
		}
		if len(pos) > 0 {
			return usageError{fmt.Errorf("unexpected arguments: %v", pos)}
		}
		var p page
		if err := c.call(ctx, "GET", "/v1/orders"+query(map[string]string{"status": status, "network": network,
			"external_id": ext, "limit": limit, "cursor": cursor}), nil, &p); err != nil || c.json {
			return err
		}
		rows := make([][]string, len(p.Data))
		for i, o := range p.Data {
			rows[i] = []string{str(o["id"]), str(o["external_id"]), str(o["status"]), str(o["dispute_reason"]),
				str(o["network"]), str(o["asset"]), str(o["pay_amount"]), str(o["received_amount"]), when(o["created_at"])}
		}
		c.table([]string{"ID", "EXTERNAL ID", "STATUS", "REASON", "NETWORK", "ASSET", "PAY", "RECEIVED", "CREATED"}, rows)
		c.next(p.NextCursor)
		return nil
	case "show":
		c, pos, err := opFlags(e, "orders show", args, nil)
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return usageError{errors.New("usage: paywatch orders show ORDER_ID")}
		}
		rawOrder, err := c.raw(ctx, "GET", "/v1/orders/"+url.PathEscape(pos[0]), nil)
		if err != nil {
			return err
		}
		rawEvents, err := c.raw(ctx, "GET", "/v1/orders/"+url.PathEscape(pos[0])+"/events", nil)
		if err != nil {
			return err
		}
		if c.json {
			fmt.Fprintf(c.out, "{\"order\":%s,\"events\":%s}\n", strings.TrimSpace(string(rawOrder)), strings.TrimSpace(string(rawEvents)))
			return nil
		}
		var o map[string]any
		var events []map[string]any
		if err := json.Unmarshal(rawOrder, &o); err != nil {
			return err
		}
		if err := json.Unmarshal(rawEvents, &events); err != nil {
			return err
		}
		fields := [][]string{{"id", str(o["id"])}, {"external id", str(o["external_id"])},
			{"status", str(o["status"])}, {"dispute reason", str(o["dispute_reason"])},
			{"network", str(o["network"])}, {"asset", str(o["asset"]) + " " + str(o["asset_contract"])},
			{"amount", str(o["amount"])}, {"pay", str(o["pay_amount"]) + " to " + str(o["pay_address"])},
			{"received", str(o["received_amount"])},
			{"confirmations", str(o["confirmations"]) + " of " + str(o["required_confirmations"])},
			{"marked paid", when(o["customer_marked_paid_at"]) + " " + str(o["tx_hash_hint"])},
			{"created", when(o["created_at"])}, {"expires", when(o["expires_at"])}, {"settled", when(o["settled_at"])}}
		w := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
		for _, f := range fields {
			fmt.Fprintf(w, "%s:\t%s\n", f[0], f[1])
		}
		w.Flush()
		if trs, _ := o["transfers"].([]any); len(trs) > 0 {
			fmt.Fprintln(c.out, "\nTransfers:")
			rows := [][]string{}
			for _, t := range trs {
				m := t.(map[string]any)
				rows = append(rows, []string{str(m["id"]), str(m["tx_hash"]), str(m["amount"]), str(m["state"]),
					str(m["block_number"]), str(m["confirmations"])})
			}
			c.table([]string{"ID", "TX HASH", "AMOUNT", "STATE", "BLOCK", "CONF"}, rows)
		}
		fmt.Fprintln(c.out, "\nTimeline:")
		rows := make([][]string, len(events))
		for i, ev := range events {
			move := ""
			if ev["to_status"] != nil {
				move = str(ev["from_status"]) + " → " + str(ev["to_status"])
			}
			detail := ""
			if ev["detail"] != nil {
				detail = str(ev["detail"])
			}
			rows[i] = []string{when(ev["at"]), str(ev["type"]), move, str(ev["actor"]), detail}
		}
		c.table([]string{"AT", "EVENT", "STATUS", "ACTOR", "DETAIL"}, rows)
		return nil
	}
	return usageError{fmt.Errorf("usage: paywatch orders list|show ...\n\n%s", operatorUsage)}
}

func transfersCommand(ctx context.Context, e *env, args []string) error {
	sub, args := subcommand(args)
	if helpAsked(e, sub) {
		return nil
	}
	switch sub {
	case "list":
		var unmatched bool
		var state, network, asset, limit, cursor string
		c, pos, err := opFlags(e, "transfers list", args, func(fs *flag.FlagSet) {
			fs.BoolVar(&unmatched, "unmatched", false, "only the inbox: transfers matched to no order")
			fs.StringVar(&state, "state", "", "seen, confirmed or orphaned")
			fs.StringVar(&network, "network", "", "only this network")
			fs.StringVar(&asset, "asset", "", "only this asset")
			fs.StringVar(&limit, "limit", "", "transfers per page (1-500, default 50)")
			fs.StringVar(&cursor, "cursor", "", "where the page starts (from a previous page)")
		})
		if err != nil {
			return err
		}
		if len(pos) > 0 {
			return usageError{fmt.Errorf("unexpected arguments: %v", pos)}
		}
		params := map[string]string{"state": state, "network": network, "asset": asset, "limit": limit, "cursor": cursor}
		if unmatched {
			params["matched"] = "false"
		}
		var p page
		if err := c.call(ctx, "GET", "/v1/transfers"+query(params), nil, &p); err != nil || c.json {
			return err
		}
		rows := make([][]string, len(p.Data))
		for i, t := range p.Data {
			rows[i] = []string{str(t["id"]), str(t["network"]), str(t["asset"]), str(t["amount"]), str(t["to"]),
				str(t["state"]), str(t["confirmations"]), str(t["order_id"]), str(t["flags"]), str(t["tx_hash"])}
		}
		c.table([]string{"ID", "NETWORK", "ASSET", "AMOUNT", "TO", "STATE", "CONF", "ORDER", "FLAGS", "TX HASH"}, rows)
		c.next(p.NextCursor)
		return nil
	case "show":
		c, pos, err := opFlags(e, "transfers show", args, nil)
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return usageError{errors.New("usage: paywatch transfers show TRANSFER_ID")}
		}
		var t map[string]any
		if err := c.call(ctx, "GET", "/v1/transfers/"+url.PathEscape(pos[0]), nil, &t); err != nil || c.json {
			return err
		}
		printTransfer(c, t)
		return nil
	case "attach":
		var order, note string
		c, pos, err := opFlags(e, "transfers attach", args, func(fs *flag.FlagSet) {
			fs.StringVar(&order, "order", "", "the order to attach the transfer to (required)")
			fs.StringVar(&note, "note", "", "why (required; kept on the order's timeline)")
		})
		if err != nil {
			return err
		}
		if len(pos) != 1 || order == "" || note == "" {
			return usageError{errors.New("usage: paywatch transfers attach TRANSFER_ID --order ORDER_ID --note TEXT")}
		}
		var t map[string]any
		if err := c.call(ctx, "POST", "/v1/transfers/"+url.PathEscape(pos[0])+"/attach",
			map[string]string{"order_id": order, "note": note}, &t); err != nil || c.json {
			return err
		}
		fmt.Fprintf(c.out, "attached %s to %s\n", pos[0], order)
		printTransfer(c, t)
		return nil
	}
	return usageError{fmt.Errorf("usage: paywatch transfers list|show|attach ...\n\n%s", operatorUsage)}
}

func printTransfer(c *opClient, t map[string]any) {
	w := tabwriter.NewWriter(c.out, 0, 0, 2, ' ', 0)
	for _, k := range []string{"id", "network", "asset", "asset_contract", "tx_hash", "index", "from", "to", "amount",
		"block_number", "block_hash", "confirmations", "state", "order_id", "flags", "first_seen_at"} {
		fmt.Fprintf(w, "%s:\t%s\n", strings.ReplaceAll(k, "_", " "), str(t[k]))
	}
	w.Flush()
}

func resolveCommand(ctx context.Context, e *env, args []string) error {
	var outcome, note string
	c, pos, err := opFlags(e, "resolve", args, func(fs *flag.FlagSet) {
		fs.StringVar(&outcome, "outcome", "", "settled, refunded or cancelled (required)")
		fs.StringVar(&note, "note", "", "why (required; kept on the order's timeline)")
	})
	if err != nil {
		return err
	}
	if len(pos) != 1 || outcome == "" || note == "" {
		return usageError{errors.New("usage: paywatch resolve ORDER_ID --outcome settled|refunded|cancelled --note TEXT")}
	}
	var o map[string]any
	if err := c.call(ctx, "POST", "/v1/orders/"+url.PathEscape(pos[0])+"/resolve",
		map[string]string{"outcome": outcome, "note": note}, &o); err != nil || c.json {
		return err
	}
	fmt.Fprintf(c.out, "order %s is %s\n", str(o["id"]), str(o["status"]))
	return nil
}

func webhooksCommand(ctx context.Context, e *env, args []string) error {
	sub, args := subcommand(args)
	if helpAsked(e, sub) {
		return nil
	}
	switch sub {
	case "list":
		var order, event, status, limit, cursor string
		c, pos, err := opFlags(e, "webhooks list", args, func(fs *flag.FlagSet) {
			fs.StringVar(&order, "order", "", "only this order's events")
			fs.StringVar(&event, "event", "", "only this event")
			fs.StringVar(&status, "status", "", "pending, delivered, failed or refused")
			fs.StringVar(&limit, "limit", "", "deliveries per page (1-500, default 50)")
			fs.StringVar(&cursor, "cursor", "", "where the page starts (from a previous page)")
		})
		if err != nil {
			return err
		}
		if len(pos) > 0 {
			return usageError{fmt.Errorf("unexpected arguments: %v", pos)}
		}
		var p page
		if err := c.call(ctx, "GET", "/v1/webhooks/deliveries"+query(map[string]string{"order_id": order,
			"event_id": event, "status": status, "limit": limit, "cursor": cursor}), nil, &p); err != nil || c.json {
			return err
		}
		rows := make([][]string, len(p.Data))
		for i, d := range p.Data {
			rows[i] = []string{str(d["event_id"]), str(d["type"]), str(d["order_id"]), str(d["status"]),
				str(d["attempts"]), str(d["last_status_code"]), when(d["next_attempt_at"]), when(d["delivered_at"]), str(d["last_error"])}
		}
		c.table([]string{"EVENT", "TYPE", "ORDER", "STATUS", "ATTEMPTS", "CODE", "NEXT ATTEMPT", "DELIVERED", "LAST ERROR"}, rows)
		c.next(p.NextCursor)
		return nil
	case "redeliver":
		c, pos, err := opFlags(e, "webhooks redeliver", args, nil)
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return usageError{errors.New("usage: paywatch webhooks redeliver EVENT_ID")}
		}
		var d map[string]any
		if err := c.call(ctx, "POST", "/v1/webhooks/events/"+url.PathEscape(pos[0])+"/redeliver", nil, &d); err != nil || c.json {
			return err
		}
		fmt.Fprintf(c.out, "event %s (%s) queued for delivery\n", str(d["event_id"]), str(d["type"]))
		return nil
	}
	return usageError{fmt.Errorf("usage: paywatch webhooks list|redeliver ...\n\n%s", operatorUsage)}
}

func networksCommand(ctx context.Context, e *env, args []string) error {
	c, pos, err := opFlags(e, "networks", args, nil)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %v", pos)}
	}
	var p page
	if err := c.call(ctx, "GET", "/v1/networks", nil, &p); err != nil || c.json {
		return err
	}
	rows := make([][]string, len(p.Data))
	for i, n := range p.Data {
		rows[i] = []string{str(n["name"]), str(n["family"]), str(n["health"]), str(n["head"]), str(n["cursor"]),
			str(n["lag_blocks"]), when(n["updated_at"]), str(n["last_error"])}
	}
	c.table([]string{"NETWORK", "FAMILY", "HEALTH", "HEAD", "CURSOR", "LAG", "UPDATED", "LAST ERROR"}, rows)
	return nil
}

// subcommand splits off the first argument.
func subcommand(args []string) (string, []string) {
	if len(args) == 0 {
		return "", nil
	}
	return args[0], args[1:]
}

// helpAsked reports whether a command was asked for its help instead of a
// subcommand.
func helpAsked(e *env, sub string) bool {
	if sub == "-h" || sub == "--help" || sub == "-help" || sub == "help" {
		fmt.Fprint(e.stdout, operatorUsage)
		return true
	}
	return false
}
