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

// listFlag is a filter of a list command: --name sets the query
// parameter param to the flag's text or, for a switch (value set), to
// value.
type listFlag struct {
	name, param, value, help string
}

// listCommand runs a list subcommand: its filters, --limit and --cursor,
// one page of path as a table of header and row, and where the next page
// starts.
func listCommand(ctx context.Context, e *env, args []string, name, path, items string, flags []listFlag,
	header []string, row func(map[string]any) []string) error {
	texts := make([]string, len(flags))
	switches := make([]bool, len(flags))
	var limit, cursor string
	c, pos, err := opFlags(e, name, args, func(fs *flag.FlagSet) {
		for i, f := range flags {
			if f.value != "" {
				fs.BoolVar(&switches[i], f.name, false, f.help)
			} else {
				fs.StringVar(&texts[i], f.name, "", f.help)
			}
		}
		fs.StringVar(&limit, "limit", "", items+" per page (1-500, default 50)")
		fs.StringVar(&cursor, "cursor", "", "where the page starts (from a previous page)")
	})
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %v", pos)}
	}
	params := map[string]string{"limit": limit, "cursor": cursor}
	for i, f := range flags {
		switch {
		case f.value == "":
			params[f.param] = texts[i]
		case switches[i]:
			params[f.param] = f.value
		}
	}
	var p page
	if err := c.call(ctx, "GET", path+query(params), nil, &p); err != nil || c.json {
		return err
	}
	rows := make([][]string, len(p.Data))
	for i, item := range p.Data {
		rows[i] = row(item)
	}
	c.table(header, rows)
	c.next(p.NextCursor)
	return nil
}

func ordersCommand(ctx context.Context, e *env, args []string) error {
	sub, args := subcommand(args)
	if helpAsked(e, sub) {
		return nil
	}
	switch sub {
	case "list":
		return listCommand(ctx, e, args, "orders list", "/v1/orders", "orders", []listFlag{
			{name: "status", param: "status", help: "only orders with this status"},
			{name: "network", param: "network", help: "only orders on this network"},
			{name: "external-id", param: "external_id", help: "the order with this external id"},
		}, []string{"ID", "EXTERNAL ID", "STATUS", "REASON", "NETWORK", "ASSET", "PAY", "RECEIVED", "CREATED"},
			func(o map[string]any) []string {
				return []string{str(o["id"]), str(o["external_id"]), str(o["status"]), str(o["dispute_reason"]),
					str(o["network"]), str(o["asset"]), str(o["pay_amount"]), str(o["received_amount"]), when(o["created_at"])}
			})
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
		return listCommand(ctx, e, args, "transfers list", "/v1/transfers", "transfers", []listFlag{
			{name: "unmatched", param: "matched", value: "false", help: "only the inbox: transfers matched to no order"},
			{name: "state", param: "state", help: "seen, confirmed or orphaned"},
			{name: "network", param: "network", help: "only this network"},
			{name: "asset", param: "asset", help: "only this asset"},
		}, []string{"ID", "NETWORK", "ASSET", "AMOUNT", "TO", "STATE", "CONF", "ORDER", "FLAGS", "TX HASH"},
			func(t map[string]any) []string {
				return []string{str(t["id"]), str(t["network"]), str(t["asset"]), str(t["amount"]), str(t["to"]),
					str(t["state"]), str(t["confirmations"]), str(t["order_id"]), str(t["flags"]), str(t["tx_hash"])}
			})
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
		return listCommand(ctx, e, args, "webhooks list", "/v1/webhooks/deliveries", "deliveries", []listFlag{
			{name: "order", param: "order_id", help: "only this order's events"},
			{name: "event", param: "event_id", help: "only this event"},
			{name: "status", param: "status", help: "pending, delivered, failed or refused"},
		}, []string{"EVENT", "TYPE", "ORDER", "STATUS", "ATTEMPTS", "CODE", "NEXT ATTEMPT", "DELIVERED", "LAST ERROR"},
			func(d map[string]any) []string {
				return []string{str(d["event_id"]), str(d["type"]), str(d["order_id"]), str(d["status"]),
					str(d["attempts"]), str(d["last_status_code"]), when(d["next_attempt_at"]), when(d["delivered_at"]), str(d["last_error"])}
			})
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
