// Package metrics exposes paywatch's Prometheus metrics: what the scanners,
// the reconciler and the webhook sender report as they work, and what is
// read from the database at each scrape (network heads and cursors, orders
// by status, the webhook backlog).
package metrics

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/paywatch/paywatch/chains/scan"
	"github.com/paywatch/paywatch/migrations/pg"
	"github.com/paywatch/paywatch/reconcile/outbox"
)

// Metrics is the daemon's registry and its instruments.
type Metrics struct {
	reg *prometheus.Registry

	scanBatch     *prometheus.HistogramVec
	scanBlocks    *prometheus.CounterVec
	transfersSeen *prometheus.CounterVec
	scanErrors    *prometheus.CounterVec
	passDuration  prometheus.Histogram
	passFailures  prometheus.Counter
	webhookTries  *prometheus.CounterVec
	webhookTime   prometheus.Histogram
	readsRetried  prometheus.Counter

	// state reads the gauges from the database.
	state *state
}

// New registers every metric; state read at scrape time comes from db.
func New(db *sqlx.DB, log *slog.Logger) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), state: &state{db: db, log: log, backlog: outbox.NewStore(db), now: time.Now}}
	m.state.trace = &pg.Trace{Retried: func(err error) {
		m.readsRetried.Inc()
		log.Warn("a database connection had died; the read runs again on another", "err", err)
	}}
	m.scanBatch = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "paywatch_scan_batch_seconds",
		Help:    "Time to read and commit one batch of blocks.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10)}, []string{"network"})
	m.scanBlocks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "paywatch_scan_blocks_total",
		Help: "Blocks scanned and committed."}, []string{"network"})
	m.transfersSeen = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "paywatch_transfers_seen_total",
		Help: "Incoming transfers to watched addresses recorded by the scanner."}, []string{"network"})
	m.scanErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "paywatch_scan_errors_total",
		Help: "Failed scan steps, by kind: timeout, connection, range_too_large, reorg_too_deep, cursor_moved, rpc."},
		[]string{"network", "kind"})
	m.passDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "paywatch_reconcile_pass_seconds",
		Help: "Duration of reconciler passes.", Buckets: prometheus.ExponentialBuckets(0.001, 3, 10)})
	m.passFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "paywatch_reconcile_failures_total",
		Help: "Reconciler passes that failed (retried at the next tick)."})
	m.webhookTries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "paywatch_webhook_attempts_total",
		Help: "Webhook delivery attempts, by outcome: delivered, pending (failed, to be retried), refused."},
		[]string{"outcome"})
	m.webhookTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "paywatch_webhook_latency_seconds",
		Help: "Time the storefront took to answer a webhook.", Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 10)})
	m.readsRetried = prometheus.NewCounter(prometheus.CounterOpts{Name: "paywatch_database_reads_retried_total",
		Help: "Attempts of reads (and of transaction starts) run again on another connection because theirs had died."})
	m.reg.MustRegister(m.scanBatch, m.scanBlocks, m.transfersSeen, m.scanErrors, m.passDuration, m.passFailures,
		m.webhookTries, m.webhookTime, m.readsRetried,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.state)
	return m
}

// Pools exports the connection pools' statistics (open, in use, idle, and
// how often and how long a request waited for a connection), each under
// its name (the go_sql_* metrics, labelled db_name).
func (m *Metrics) Pools(pools map[string]*sql.DB) {
	for name, db := range pools {
		m.reg.MustRegister(collectors.NewDBStatsCollector(db, name))
	}
}

// Handler serves the metrics in Prometheus' text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

var _ scan.Observer = (*Metrics)(nil)

// Batch implements scan.Observer.
func (m *Metrics) Batch(network string, blocks, transfers int, took time.Duration) {
	m.scanBatch.WithLabelValues(network).Observe(took.Seconds())
	m.scanBlocks.WithLabelValues(network).Add(float64(blocks))
	m.transfersSeen.WithLabelValues(network).Add(float64(transfers))
}

// StepFailed implements scan.Observer.
func (m *Metrics) StepFailed(network, kind string) {
	m.scanErrors.WithLabelValues(network, kind).Inc()
}

// Pass records a reconciler pass.
func (m *Metrics) Pass(took time.Duration, err error) {
	m.passDuration.Observe(took.Seconds())
	if err != nil {
		m.passFailures.Inc()
	}
}

// Trace is what the daemon's reads report to (pg.WithTrace): each read
// run again on another connection is counted, and logged with why.
func (m *Metrics) Trace() *pg.Trace { return m.state.trace }

// Webhook records a delivery attempt.
func (m *Metrics) Webhook(outcome string, latency time.Duration) {
	m.webhookTries.WithLabelValues(outcome).Inc()
	m.webhookTime.Observe(latency.Seconds())
}

// state reads gauges from the database, at most once per cacheFor:
// /metrics needs no key, and scrapes in a loop must not load the database.
type state struct {
	db      *sqlx.DB
	log     *slog.Logger
	backlog *outbox.Store
	now     func() time.Time // the clock the cache's age is read on
	trace   *pg.Trace        // its own reads report to it too

	mu     sync.Mutex
	at     time.Time
	cached []prometheus.Metric
}

// cacheFor is how long gauges read from the database are served again.
const cacheFor = 10 * time.Second

var (
	headDesc    = prometheus.NewDesc("paywatch_network_head", "The newest block the network's node reported.", []string{"network"}, nil)
	cursorDesc  = prometheus.NewDesc("paywatch_network_cursor", "The last block scanned and committed.", []string{"network"}, nil)
	lagDesc     = prometheus.NewDesc("paywatch_network_lag_blocks", "Blocks between the head and the cursor.", []string{"network"}, nil)
	haltedDesc  = prometheus.NewDesc("paywatch_network_halted", "1 when the network's scanner halted on a reorg deeper than its window.", []string{"network"}, nil)
	erroredDesc = prometheus.NewDesc("paywatch_network_error", "1 when the scanner's last step failed.", []string{"network"}, nil)
	ordersDesc  = prometheus.NewDesc("paywatch_orders", "Orders by status.", []string{"status"}, nil)
	backlogDesc = prometheus.NewDesc("paywatch_webhook_backlog", "Webhook events not delivered, by status: pending, failed, refused.", []string{"status"}, nil)
	oldestDesc  = prometheus.NewDesc("paywatch_webhook_oldest_pending_seconds", "Age of the oldest webhook event still pending (0 when none).", nil, nil)
	upDesc      = prometheus.NewDesc("paywatch_database_up", "1 when the database answered this scrape.", nil, nil)
)

func (s *state) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{headDesc, cursorDesc, lagDesc, haltedDesc, erroredDesc, ordersDesc, backlogDesc, oldestDesc, upDesc} {
		ch <- d
	}
}

func (s *state) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock() // one reader at a time; the others get its answer
	defer s.mu.Unlock()
	if s.now().Sub(s.at) >= cacheFor {
		buf := make(chan prometheus.Metric, 256)
		go func() {
			s.collect(buf)
			close(buf)
		}()
		s.cached = s.cached[:0]
		for m := range buf {
			s.cached = append(s.cached, m)
		}
		s.at = s.now()
	}
	for _, m := range s.cached {
		ch <- m
	}
}

func (s *state) collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(pg.WithTrace(context.Background(), s.trace), 5*time.Second)
	defer cancel()
	up := 1.0
	defer func() { ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, up) }()
	var nets []scan.Status
	if err := pg.Read(ctx, s.db, func() error {
		nets = nil
		return s.db.SelectContext(ctx, &nets, `SELECT network, block_number, block_hash, head, last_error, halted, updated_at
			FROM chain_cursors`)
	}); err != nil {
		s.log.Warn("metrics: read chain cursors", "err", err)
		up = 0
		return
	}
	for _, n := range nets {
		if n.Head != nil {
			ch <- prometheus.MustNewConstMetric(headDesc, prometheus.GaugeValue, float64(*n.Head), n.Network)
		}
		if n.Cursor != nil {
			ch <- prometheus.MustNewConstMetric(cursorDesc, prometheus.GaugeValue, float64(*n.Cursor), n.Network)
		}
		if n.Head != nil && n.Cursor != nil {
			ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(max(*n.Head-*n.Cursor, 0)), n.Network)
		}
		ch <- prometheus.MustNewConstMetric(haltedDesc, prometheus.GaugeValue, b2f(n.Halted), n.Network)
		ch <- prometheus.MustNewConstMetric(erroredDesc, prometheus.GaugeValue, b2f(n.LastError != nil), n.Network)
	}
	var orders []struct {
		Status string `db:"status"`
		N      int64  `db:"n"`
	}
	if err := pg.Read(ctx, s.db, func() error {
		orders = nil
		return s.db.SelectContext(ctx, &orders, `SELECT status, count(*) AS n FROM orders GROUP BY status`)
	}); err != nil {
		s.log.Warn("metrics: count orders", "err", err)
		up = 0
		return
	}
	for _, o := range orders {
		ch <- prometheus.MustNewConstMetric(ordersDesc, prometheus.GaugeValue, float64(o.N), o.Status)
	}
	b, err := s.backlog.Backlog(ctx)
	if err != nil {
		s.log.Warn("metrics: webhook backlog", "err", err)
		up = 0
		return
	}
	ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(b.Pending), outbox.StatusPending)
	ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(b.Failed), outbox.StatusFailed)
	ch <- prometheus.MustNewConstMetric(backlogDesc, prometheus.GaugeValue, float64(b.Refused), outbox.StatusRefused)
	ch <- prometheus.MustNewConstMetric(oldestDesc, prometheus.GaugeValue, b.OldestAge)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
