// Package api serves paywatch's HTTP API (README "HTTP API"): the storefront's order
// endpoints and the operators' views, behind bearer keys with roles.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paywatch/paywatch"
	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/cmd/paywatch/internal/config"
	"github.com/paywatch/paywatch/ledger"
	"github.com/paywatch/paywatch/reconcile"
	"github.com/paywatch/paywatch/reconcile/orders"
	"github.com/paywatch/paywatch/reconcile/outbox"
)

// MaxBodyBytes is the largest request body accepted.
const MaxBodyBytes = 64 << 10

// Store is what the API needs of the order store.
type Store interface {
	Create(ctx context.Context, req orders.CreateRequest) (*paywatch.Order, bool, error)
	Get(ctx context.Context, id string) (*paywatch.Order, error)
	List(ctx context.Context, f orders.Filter) ([]*paywatch.Order, string, error)
	MarkPaid(ctx context.Context, id, txHash, actor string) (*paywatch.Order, error)
	Cancel(ctx context.Context, id, actor string) (*paywatch.Order, error)
	Events(ctx context.Context, id string) ([]paywatch.Event, error)
	ListTransfers(ctx context.Context, f orders.TransferFilter) ([]paywatch.Transfer, string, error)
	GetTransfer(ctx context.Context, id string) (*paywatch.Transfer, error)
	Gap(ctx context.Context, network, xpub string) (orders.Gap, error)
	Ping(ctx context.Context) error
}

var _ Store = (*orders.Store)(nil)

// Chains is what the API needs of the chain watchers' state.
type Chains interface {
	Statuses(ctx context.Context) (map[string]scan.Status, error)
}

var _ Chains = (*scan.Store)(nil)

// Operator carries out operators' actions.
type Operator interface {
	Attach(ctx context.Context, transferID, orderID, note, actor string) error
	Resolve(ctx context.Context, orderID string, outcome paywatch.Status, note, actor string) error
}

var _ Operator = (*reconcile.Operator)(nil)

// Ledger reads balances.
type Ledger interface {
	Balances(ctx context.Context, prefix string) ([]ledger.Balance, error)
}

var _ Ledger = (*ledger.Book)(nil)

// Probes is what the health and readiness probes read.
type Probes interface {
	Statuses(ctx context.Context) (map[string]scan.Status, error)
	Ping(ctx context.Context) error
}

// Webhooks reads deliveries and queues events again.
type Webhooks interface {
	Deliveries(ctx context.Context, f outbox.Filter) ([]outbox.Delivery, string, error)
	Redeliver(ctx context.Context, eventID, actor string) (*outbox.Delivery, error)
}

var _ Webhooks = (*outbox.Store)(nil)

// Deps are what the API serves from.
type Deps struct {
	Orders   Store
	Chains   Chains
	Operator Operator
	Ledger   Ledger
	Webhooks Webhooks
	// Changes wakes long-polls; without it ?wait= answers at once.
	Changes Changes
	// Metrics serves GET /metrics; may be nil.
	Metrics http.Handler
	// Probes answer /healthz and /readyz through connections API load
	// cannot take (the daemon's control pool); nil: Chains and Orders.
	Probes Probes
	// Schema tells the database's schema version and the newest this
	// binary knows (for /readyz); may be nil.
	Schema func(ctx context.Context) (current, latest int64, err error)
	// Nudge asks the reconciler for a pass now (after an operator's
	// action); may be nil.
	Nudge func()
}

// Server is the HTTP API.
type Server struct {
	cfg      *config.Config
	store    Store
	chains   Chains
	ops      Operator
	ledger   Ledger
	webhooks Webhooks
	changes  Changes
	probes   Probes
	metrics  http.Handler
	schema   func(ctx context.Context) (current, latest int64, err error)
	// waiting counts long-polls in progress; at most maxWaiting
	// (MaxWaiting) wait at once.
	waiting    atomic.Int64
	maxWaiting int64
	// draining is closed when the server shuts down: long-polls answer.
	draining  chan struct{}
	drainOnce sync.Once
	nudge     func()
	keys      *keyring
	log       *slog.Logger
}

// New returns the API configured by cfg. It takes the API keys out of
// cfg: their Key fields are cleared, and only the keys' SHA-256 hashes are
// kept.
func New(cfg *config.Config, d Deps, log *slog.Logger) *Server {
	nudge := d.Nudge
	if nudge == nil {
		nudge = func() {}
	}
	keys := newKeyring(cfg.APIKeys)
	for i := range cfg.APIKeys {
		cfg.APIKeys[i].Key = ""
	}
	return &Server{cfg: cfg, store: d.Orders, chains: d.Chains, ops: d.Operator, ledger: d.Ledger, webhooks: d.Webhooks, changes: d.Changes, probes: d.Probes, metrics: d.Metrics, schema: d.Schema, draining: make(chan struct{}), nudge: nudge,
		keys: keys, maxWaiting: MaxWaiting, log: log}
}

// Handler returns the routed API with logging and panic recovery.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	route := func(method, path string, role config.Role, h handlerFunc) {
		mux.Handle(method+" "+path, s.authorize(role, h))
	}
	// Storefront.
	route("POST", "/v1/orders", config.RoleStorefront, s.createOrder)
	route("GET", "/v1/orders", config.RoleStorefront, s.listOrders)
	route("GET", "/v1/orders/{id}", config.RoleStorefront, s.getOrder)
	route("POST", "/v1/orders/{id}/paid", config.RoleStorefront, s.markPaid)
	route("POST", "/v1/orders/{id}/cancel", config.RoleStorefront, s.cancelOrder)
	// Operators.
	route("GET", "/v1/orders/{id}/events", config.RoleOperator, s.orderEvents)
	route("GET", "/v1/transfers", config.RoleOperator, s.listTransfers)
	route("GET", "/v1/transfers/{id}", config.RoleOperator, s.getTransfer)
	route("GET", "/v1/networks", config.RoleOperator, s.listNetworks)
	route("POST", "/v1/transfers/{id}/attach", config.RoleOperator, s.attachTransfer)
	route("POST", "/v1/orders/{id}/resolve", config.RoleOperator, s.resolveOrder)
	route("GET", "/v1/ledger/balances", config.RoleOperator, s.ledgerBalances)
	route("GET", "/v1/webhooks/deliveries", config.RoleOperator, s.listDeliveries)
	route("POST", "/v1/webhooks/events/{id}/redeliver", config.RoleOperator, s.redeliver)
	// Probes.
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /openapi.json", s.openAPI)
	if s.metrics != nil {
		mux.Handle("GET /metrics", s.metrics)
	}
	// Everything else answers in the API's error format.
	for _, p := range []string{"/v1/orders", "/v1/orders/{id}", "/v1/orders/{id}/paid", "/v1/orders/{id}/cancel",
		"/v1/orders/{id}/events", "/v1/transfers", "/v1/transfers/{id}", "/v1/networks", "/healthz", "/readyz", "/metrics", "/openapi.json",
		"/v1/transfers/{id}/attach", "/v1/orders/{id}/resolve", "/v1/ledger/balances",
		"/v1/webhooks/deliveries", "/v1/webhooks/events/{id}/redeliver"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, paywatch.Errorf(paywatch.CodeInvalidRequest, "method %s is not allowed on %s", r.Method, r.URL.Path), http.StatusMethodNotAllowed)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, paywatch.Errorf(paywatch.CodeNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path), 0)
	})
	return s.logRequests(mux)
}

// handlerFunc is an API handler that returns an error instead of writing
// it; errors are turned into responses in one place (writeError).
type handlerFunc func(w http.ResponseWriter, r *http.Request, caller *config.APIKey) error

// healthz answers 200 while the process works and 503 when a network's
// scanner halted on a reorg too deep to handle: that needs a person.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	statuses, err := s.probeStatuses(ctx)
	if err != nil {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "networks": "unknown: database unavailable"})
		return
	}
	var halted []string
	for _, n := range s.cfg.Networks {
		if statuses[n.Name].Halted {
			halted = append(halted, n.Name)
		}
	}
	if len(halted) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "halted", "halted_networks": halted})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.probePing(ctx); err != nil {
		s.log.Warn("readiness check failed", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "database unavailable"})
		return
	}
	if s.schema != nil {
		current, latest, err := s.schema(ctx)
		if err != nil {
			s.log.Warn("readiness check failed", "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "schema version unknown"})
			return
		}
		if current < latest {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "migrations pending",
				"schema_version": current, "latest_version": latest})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) probeStatuses(ctx context.Context) (map[string]scan.Status, error) {
	if s.probes != nil {
		return s.probes.Statuses(ctx)
	}
	return s.chains.Statuses(ctx)
}

func (s *Server) probePing(ctx context.Context) error {
	if s.probes != nil {
		return s.probes.Ping(ctx)
	}
	return s.store.Ping(ctx)
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	entry  requestLog
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// requestLog is what a request's log line says beyond its method, path,
// status and duration: the key that made it, and whether it is a routine
// read a checkout page repeats (logged at debug level when it succeeds).
type requestLog struct {
	key     string
	routine bool
}

// logEntry returns the log entry of the line of the request w answers
// (nil outside logRequests).
func logEntry(w http.ResponseWriter) *requestLog {
	if rec, ok := w.(*statusRecorder); ok {
		return &rec.entry
	}
	return nil
}

// logRequests logs a line per request: at info level, except a routine
// read that succeeded (a storefront reading one order, which a checkout
// page polls), which is at debug level.
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("handler panicked", "method", r.Method, "path", r.URL.Path, "panic", p)
				writeError(rec, paywatch.Errorf(paywatch.CodeInternal, "internal error"), 0)
			}
			if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || r.URL.Path == "/metrics" {
				return
			}
			level := slog.LevelInfo
			if rec.entry.routine && rec.status < 400 {
				level = slog.LevelDebug
			}
			s.log.Log(r.Context(), level, "request", "method", r.Method, "path", r.URL.Path, "status", rec.status,
				"key", rec.entry.key, "duration", time.Since(start).Round(time.Microsecond))
		}()
		next.ServeHTTP(rec, r)
	})
}
