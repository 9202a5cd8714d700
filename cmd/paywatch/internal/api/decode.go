package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/paywatch/paywatch"
)

// decodeBody reads a JSON object into dst: at most MaxBodyBytes, unknown
// fields rejected, nothing after the object. An empty body is fine when
// optional is set.
func decodeBody(w http.ResponseWriter, r *http.Request, dst any, optional bool) error {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return paywatch.Errorf(paywatch.CodePayloadTooLarge, "request body is over %d bytes", MaxBodyBytes)
		}
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "could not read the request body")
	}
	if len(bytes.TrimSpace(data)) == 0 {
		if optional {
			return nil
		}
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "request body is required (a JSON object)")
	}
	return decodeJSON(data, dst)
}

func decodeJSON(data []byte, dst any) error {
	if bytes.Contains(data, []byte(`\u0000`)) {
		if field := nulField(data); field != "" {
			return paywatch.Errorf(paywatch.CodeInvalidRequest, "%s must not hold NUL characters (\\u0000)", field)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "request body must hold one JSON object and nothing after it")
	}
	return nil
}

// nulField returns where a JSON document holds a NUL character in a key or
// a string ("" where it holds none): PostgreSQL cannot store one in text or
// JSONB.
func nulField(data []byte) string {
	var v any
	if json.Unmarshal(data, &v) != nil {
		return "" // the decoder reports what is wrong
	}
	var walk func(path string, v any) string
	walk = func(path string, v any) string {
		switch v := v.(type) {
		case string:
			if strings.ContainsRune(v, 0) {
				return path
			}
		case []any:
			for i, e := range v {
				if p := walk(fmt.Sprintf("%s[%d]", path, i), e); p != "" {
					return p
				}
			}
		case map[string]any:
			for k, e := range v {
				p := k
				if path != "" {
					p = path + "." + k
				}
				if strings.ContainsRune(k, 0) {
					return strconv.Quote(p)
				}
				if p := walk(p, e); p != "" {
					return p
				}
			}
		}
		return ""
	}
	return walk("", v)
}

func jsonError(err error) error {
	var pe *paywatch.Error
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &pe):
		return pe
	case errors.As(err, &syntax):
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "malformed JSON at byte %d: %v", syntax.Offset, syntax)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return paywatch.Errorf(paywatch.CodeInvalidRequest, "request body must be a JSON object")
		}
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "field %s must be %s, not %s", typ.Field, kindName(typ.Type.Kind().String()), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "malformed JSON: the body ends too early")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return paywatch.Errorf(paywatch.CodeInvalidRequest, "unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return paywatch.Errorf(paywatch.CodeInvalidRequest, "malformed JSON: %v", err)
}

func kindName(k string) string {
	switch {
	case strings.HasPrefix(k, "int"), strings.HasPrefix(k, "uint"):
		return "an integer"
	case k == "string":
		return "a string"
	case k == "bool":
		return "true or false"
	case k == "map", k == "struct":
		return "an object"
	}
	return "a " + k
}

// amountString is an amount as the API takes it: a JSON string. A JSON
// number is refused, since it invites float rounding in the caller.
type amountString string

func (a *amountString) UnmarshalJSON(data []byte) error {
	if len(data) == 0 || data[0] != '"' {
		return paywatch.Errorf(paywatch.CodeInvalidAmount, "amount must be a decimal string such as \"12.50\", not %s", abbreviate(string(data)))
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return paywatch.Errorf(paywatch.CodeInvalidAmount, "amount is not a valid JSON string")
	}
	*a = amountString(s)
	return nil
}

func abbreviate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// quote renders a caller-supplied value safely inside a message.
func quote(s string) string { return fmt.Sprintf("%q", abbreviate(s)) }
