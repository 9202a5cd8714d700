package api_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/paywatch/paywatch/cmd/paywatch/internal/api"
)

// spec is the served OpenAPI document, loaded and validated once, with the
// operations that every test's real responses exercised.
type spec struct {
	doc    *openapi3.T
	router routers.Router
	mu     sync.Mutex
	// seen counts 2xx/3xx answers per operation.
	seen map[string]int
}

var (
	specOnce sync.Once
	theSpec  *spec
	specErr  error
)

func loadSpec() (*spec, error) {
	specOnce.Do(func() {
		raw, err := api.OpenAPI()
		if err != nil {
			specErr = err
			return
		}
		loader := openapi3.NewLoader()
		doc, err := loader.LoadFromData(raw)
		if err != nil {
			specErr = fmt.Errorf("load the OpenAPI document: %w", err)
			return
		}
		if err := doc.Validate(context.Background()); err != nil {
			specErr = fmt.Errorf("the OpenAPI document is not valid: %w", err)
			return
		}
		doc.Servers = nil // route whatever host the test server has
		router, err := gorillamux.NewRouter(doc)
		if err != nil {
			specErr = err
			return
		}
		theSpec = &spec{doc: doc, router: router, seen: map[string]int{}}
	})
	return theSpec, specErr
}

// validated wraps the API so that every answer is checked against the
// OpenAPI document: a route it does not describe, a status it does not
// list, or a body or header that does not fit fails the test. Requests
// that succeed are checked too (tests send invalid ones on purpose).
func validated(t testing.TB, h http.Handler) http.Handler {
	s, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())

		check := r.Clone(context.Background())
		check.Body = io.NopCloser(bytes.NewReader(body))
		if len(body) > 0 && check.Header.Get("Content-Type") == "" {
			check.Header.Set("Content-Type", "application/json") // the API reads JSON whatever the header says
		}
		route, params, err := s.router.FindRoute(check)
		if err != nil {
			if rec.Code != http.StatusNotFound && rec.Code != http.StatusMethodNotAllowed {
				t.Errorf("%s %s answered %d but is not in the OpenAPI document", r.Method, r.URL.Path, rec.Code)
			}
			return
		}
		in := &openapi3filter.RequestValidationInput{Request: check, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
		if rec.Code < 300 {
			if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
				t.Errorf("%s %s succeeded with a request the OpenAPI document refuses: %v", r.Method, r.URL, err)
			}
		}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: rec.Code,
			Header: rec.Header(), Body: io.NopCloser(bytes.NewReader(rec.Body.Bytes())),
			Options: &openapi3filter.Options{IncludeResponseStatus: true}}
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			t.Errorf("%s %s answered %d in a way the OpenAPI document does not describe: %v\n%s",
				r.Method, r.URL, rec.Code, err, rec.Body.String())
		}
		if rec.Code < 400 {
			s.mu.Lock()
			s.seen[route.Operation.OperationID]++
			s.mu.Unlock()
		}
	})
}

// TestMain checks, after a full run, that every documented operation was
// answered successfully at least once: the document describes nothing the
// tests did not see work.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 && flag.Lookup("test.run").Value.String() == "" && theSpec != nil {
		var missing []string
		for path, item := range theSpec.doc.Paths.Map() {
			for method, op := range item.Operations() {
				if theSpec.seen[op.OperationID] == 0 {
					missing = append(missing, method+" "+path)
				}
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			fmt.Fprintf(os.Stderr, "documented operations no test saw succeed:\n  %s\n", strings.Join(missing, "\n  "))
			code = 1
		}
	}
	os.Exit(code)
}

// The served document is the embedded one, and valid.
func TestOpenAPIServed(t *testing.T) {
	f := newFixture(t)
	res := f.do("GET", "/openapi.json", "", "")
	if res.status != 200 || !strings.Contains(string(res.body), `"openapi":"3.0.3"`) {
		t.Fatalf("GET /openapi.json: %d %.200s", res.status, res.body)
	}
	if _, err := openapi3.NewLoader().LoadFromData(res.body); err != nil {
		t.Fatal(err)
	}
}
