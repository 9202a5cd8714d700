package bitcoin

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/btcsuite/btcd/btcjson"
)

// client speaks Bitcoin's JSON-RPC over HTTP POST to one node, btcd or
// Bitcoin Core: user and password, or Core's cookie file; TLS when the URL
// is https (btcd's default), trusting an extra certificate when one is
// given. Every call takes a context, so that a node that hangs is left for
// the next one in time.
//
// (btcd's rpcclient has no per-call context in its released versions, and
// its HTTP POST mode retries a failed call for about twenty seconds on its
// own, so a sick node would stall the scanner; the requests and results
// are btcd's btcjson types, the blocks and transactions btcd's wire.)
type client struct {
	url        string
	user, pass string
	cookie     string // Core's .cookie file: "user:password", rewritten at each start
	http       *http.Client
	maxAnswer  int // bytes; maxAnswer unless a test lowers it
}

// Credentials authenticate to a node.
type Credentials struct {
	User, Pass string
	// CookieFile is Bitcoin Core's cookie file, read at each call (Core
	// writes a new one at each start).
	CookieFile string
	// CertFile is a PEM certificate to trust for https URLs (btcd makes its
	// own at first start).
	CertFile string
}

func newClient(url string, cred Credentials) (*client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 8
	if cred.CertFile != "" {
		pem, err := os.ReadFile(cred.CertFile)
		if err != nil {
			return nil, fmt.Errorf("read the node's certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", cred.CertFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &client{url: url, user: cred.User, pass: cred.Pass, cookie: cred.CookieFile, http: &http.Client{Transport: tr},
		maxAnswer: maxAnswer}, nil
}

// maxAnswer bounds one answer of a node: a few raw blocks, or a busy
// mainnet mempool's txids.
const maxAnswer = 64 << 20

// errAnswerTooLarge is a node's answer over maxAnswer.
var errAnswerTooLarge = fmt.Errorf("answer over %d MiB", maxAnswer>>20)

// call is one JSON-RPC call of a batch: its result is decoded into Result,
// or its error kept in Err.
type call struct {
	Method string
	Params []any
	Result any
	Err    error
}

// RPCError is a node's JSON-RPC error.
type RPCError = btcjson.RPCError

// noBlock reports a node's answer that it has no block at a height:
// getblockhash above the head is -1 on btcd, -8 on Bitcoin Core.
func noBlock(err error) bool {
	return isCode(err, btcjson.ErrRPCOutOfRange, btcjson.ErrRPCInvalidParameter)
}

// noTx reports a node's answer that it knows no such transaction (or has
// no index of it): -5 on both.
func noTx(err error) bool { return isCode(err, btcjson.ErrRPCNoTxInfo) }

// do sends calls as one JSON-RPC batch (one HTTP request) and decodes each
// result; an error of one call is kept in that call, an error of the
// request is returned.
func (c *client) do(ctx context.Context, calls []*call) error {
	if len(calls) == 0 {
		return nil
	}
	reqs := make([]json.RawMessage, len(calls))
	for i, cl := range calls {
		params := cl.Params
		if params == nil {
			params = []any{}
		}
		raw, err := json.Marshal(map[string]any{"jsonrpc": "1.0", "id": i, "method": cl.Method, "params": params})
		if err != nil {
			return err
		}
		reqs[i] = raw
	}
	var body []byte
	var err error
	if len(calls) == 1 {
		body = reqs[0]
	} else if body, err = json.Marshal(reqs); err != nil {
		return err
	}
	httpReq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	httpReq.Header.Set("Content-Type", "application/json")
	user, pass, err := c.auth()
	if err != nil {
		return err
	}
	httpReq.SetBasicAuth(user, pass)
	res, err := c.http.Do(httpReq)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, int64(c.maxAnswer)+1))
	if err != nil {
		return fmt.Errorf("read the node's answer: %w", err)
	}
	if len(data) > c.maxAnswer {
		return fmt.Errorf("the node's answer to %s: %w", calls[0].Method, errAnswerTooLarge)
	}
	if res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden {
		return fmt.Errorf("the node refused the credentials (HTTP %d)", res.StatusCode)
	}
	var answers []struct {
		ID     int             `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *RPCError       `json:"error"`
	}
	trimmed := bytes.TrimSpace(data)
	switch {
	case len(trimmed) > 0 && trimmed[0] == '[':
		err = json.Unmarshal(trimmed, &answers)
	case len(trimmed) > 0 && trimmed[0] == '{':
		answers = answers[:0]
		var one struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *RPCError       `json:"error"`
		}
		err = json.Unmarshal(trimmed, &one)
		answers = append(answers, one)
	default:
		return fmt.Errorf("the node answered HTTP %d: %.200s", res.StatusCode, trimmed)
	}
	if err != nil {
		return fmt.Errorf("decode the node's answer: %w", err)
	}
	if len(calls) > 1 && len(answers) == 1 && answers[0].Error != nil && len(answers[0].Result) == 0 {
		return answers[0].Error // the batch itself was refused
	}
	seen := make([]bool, len(calls))
	for _, a := range answers {
		if a.ID < 0 || a.ID >= len(calls) {
			return fmt.Errorf("the node answered an id %d it was not asked", a.ID)
		}
		cl := calls[a.ID]
		seen[a.ID] = true
		if a.Error != nil {
			cl.Err = a.Error
			continue
		}
		if cl.Result != nil {
			if err := json.Unmarshal(a.Result, cl.Result); err != nil {
				cl.Err = fmt.Errorf("%s: decode: %w", cl.Method, err)
			}
		}
	}
	for i, ok := range seen {
		if !ok {
			return fmt.Errorf("the node did not answer %s", calls[i].Method)
		}
	}
	return nil
}

// one runs a single call and returns its error.
func (c *client) one(ctx context.Context, result any, method string, params ...any) error {
	cl := &call{Method: method, Params: params, Result: result}
	if err := c.do(ctx, []*call{cl}); err != nil {
		return err
	}
	return cl.Err
}

// auth returns the credentials, reading the cookie file when there is one.
func (c *client) auth() (string, string, error) {
	if c.cookie == "" {
		return c.user, c.pass, nil
	}
	raw, err := os.ReadFile(c.cookie)
	if err != nil {
		return "", "", fmt.Errorf("read the node's cookie file: %w", err)
	}
	user, pass, ok := strings.Cut(strings.TrimSpace(string(raw)), ":")
	if !ok {
		return "", "", fmt.Errorf("%s is not a cookie file (user:password)", c.cookie)
	}
	return user, pass, nil
}

// isCode reports whether err is a node error with one of the codes.
func isCode(err error, codes ...btcjson.RPCErrorCode) bool {
	var e *RPCError
	if !errors.As(err, &e) {
		return false
	}
	for _, c := range codes {
		if e.Code == c {
			return true
		}
	}
	return false
}
