// Package metrics holds cdcout's Prometheus instruments on a registry of
// their own, and the methods the engine calls to feed them.
//
// A private registry rather than prometheus.DefaultRegisterer: two engines
// in one test process (multi-replica tests) must not collide on
// registration, and /metrics should show exactly cdcout's series plus the
// Go and process collectors, nothing a dependency registered behind our back.
//
// Every value is in base units (seconds, counts) as Prometheus expects.
// Methods are safe on a nil *Metrics, so code paths that run without an
// HTTP server (tests, `cdcout tail`) need no checks.
package metrics

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cdcout/cdcout/internal/buildinfo"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

// Metrics is one process's set of instruments.
type Metrics struct {
	reg *prometheus.Registry

	sourceLag        prometheus.Gauge
	sourceConnected  prometheus.Gauge
	changes          *prometheus.CounterVec
	claims           *prometheus.CounterVec
	digestMismatch   prometheus.Counter
	deliveries       *prometheus.CounterVec
	deliveryDuration *prometheus.HistogramVec
	deliveryLatency  *prometheus.HistogramVec
	drainErrors      *prometheus.CounterVec
	leaseHeld        *prometheus.GaugeVec
	handoffDropped   prometheus.Counter
	xaPrepared       prometheus.Gauge
	tableDDL         *prometheus.CounterVec
	filtered         *prometheus.CounterVec // filter.go
	xaSince          atomic.Int64           // unix ns of the oldest held XA PREPARE, 0 for none
	runway           runwayGauge

	mu     sync.Mutex
	outbox *outboxCollector
}

// New returns Metrics registered on a fresh registry, with the Go runtime
// and process collectors and cdcout_build_info already set.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.sourceLag = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cdcout_source_lag_seconds",
		Help: "Seconds between the source commit of the last change read and the time it was read.",
	})
	m.sourceConnected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cdcout_source_connected",
		Help: "1 while this replica's binlog connection to the source is up, else 0.",
	})
	m.changes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cdcout_changes_total",
		Help: "Row changes read from the binlog, by table (db.table) and op (c, u, d).",
	}, []string{"table", "op"})
	m.claims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cdcout_claims_total",
		Help: "Records offered to the outbox (one per change and pipe) by what their claim found at enqueue: inserted (written now), already_ours (written before by this replica), others (another replica writes them).",
	}, []string{"result"})
	m.digestMismatch = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cdcout_claim_digest_mismatch_total",
		Help: "Existing claims whose digest differed from this replica's decoding of the change (schema drift).",
	})
	m.deliveries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cdcout_deliveries_total",
		Help: "Records handed to sinks (from outbox rows or segments), by pipe and result (delivered, retried, dead).",
	}, []string{"pipe", "result"})
	m.deliveryDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cdcout_delivery_duration_seconds",
		Help:    "Duration of one sink Deliver call (one batch), by pipe.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"pipe"})
	m.deliveryLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cdcout_delivery_latency_seconds",
		Help:    "Source commit to successful delivery, per delivered record, by pipe.",
		Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
	}, []string{"pipe"})
	m.drainErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cdcout_drain_errors_total",
		Help: "State-database errors while claiming rows or segments or recording outcomes, by pipe and op (claim, record).",
	}, []string{"pipe", "op"})
	m.leaseHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cdcout_lease_held",
		Help: "1 while this replica holds the lease, else 0.",
	}, []string{"lease"})
	m.handoffDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cdcout_handoff_dropped_pending_total",
		Help: "Changes evicted from the leadership handoff buffer before they were enqueued; the next leader re-reads them from the checkpoint.",
	})
	m.xaPrepared = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "cdcout_xa_prepared",
		Help: "XA transactions read at XA PREPARE and held until their XA COMMIT or ROLLBACK; the checkpoint cannot pass the oldest.",
	})
	m.tableDDL = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cdcout_table_ddl_uncaptured_total",
		Help: "TRUNCATE and DROP TABLE statements on captured tables read from the binlog: they produce no change records, so consumers keep the rows they removed.",
	}, []string{"table", "statement"})
	m.filtered = newFilteredCounter()
	xaAge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cdcout_xa_prepared_oldest_seconds",
		Help: "Seconds since the oldest held XA transaction was read at XA PREPARE; 0 when none is held.",
	}, func() float64 {
		if ns := m.xaSince.Load(); ns != 0 {
			return time.Since(time.Unix(0, ns)).Seconds()
		}
		return 0
	})
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cdcout_build_info",
		Help: "Always 1; the labels carry the build's version and commit.",
	}, []string{"version", "commit"})
	build.WithLabelValues(buildinfo.Version(), buildinfo.Commit()).Set(1)

	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.sourceLag, m.sourceConnected, m.changes, m.claims, m.digestMismatch,
		m.deliveries, m.deliveryDuration, m.deliveryLatency, m.drainErrors,
		m.leaseHeld, m.handoffDropped, m.xaPrepared, m.tableDDL, m.filtered, xaAge, build, &m.runway,
	)
	return m
}

// Registry is the registry the instruments live on, for tests and for
// callers that add their own collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// SetSourceLag records the lag of the change just read (commit → read).
func (m *Metrics) SetSourceLag(d time.Duration) {
	if m == nil {
		return
	}
	if d < 0 {
		d = 0
	}
	m.sourceLag.Set(d.Seconds())
}

// SetPreparedXA records the XA transactions held prepared (binlog
// Stream.PreparedXA): how many, and since when the oldest.
func (m *Metrics) SetPreparedXA(n int, since time.Time) {
	if m == nil {
		return
	}
	m.xaPrepared.Set(float64(n))
	if n == 0 || since.IsZero() {
		m.xaSince.Store(0)
		return
	}
	m.xaSince.Store(since.UnixNano())
}

// SetSourceConnected records whether the binlog connection is up.
func (m *Metrics) SetSourceConnected(up bool) {
	if m == nil {
		return
	}
	m.sourceConnected.Set(boolFloat(up))
}

// ObserveChange counts one row change read from the binlog.
func (m *Metrics) ObserveChange(db, table, op string) {
	if m == nil {
		return
	}
	m.changes.WithLabelValues(db+"."+table, op).Inc()
}

// ObserveTableDDL counts one TRUNCATE or DROP TABLE (statement) of a
// captured table.
func (m *Metrics) ObserveTableDDL(table, statement string) {
	if m == nil {
		return
	}
	m.tableDDL.WithLabelValues(table, statement).Inc()
}

// ObserveEnqueue counts one outbox.Store.Enqueue's claim outcomes.
func (m *Metrics) ObserveEnqueue(r outbox.EnqueueResult) {
	if m == nil {
		return
	}
	m.claims.WithLabelValues("inserted").Add(float64(r.Records))
	m.claims.WithLabelValues("already_ours").Add(float64(r.AlreadyOurs))
	m.claims.WithLabelValues("others").Add(float64(r.OthersClaims))
	m.digestMismatch.Add(float64(r.DigestMismatches))
}

// ObserveDelivery counts one row's delivery outcome (result is delivered,
// retried or dead) and, when d > 0, observes the batch duration.
func (m *Metrics) ObserveDelivery(pipe, result string, d time.Duration) {
	if m == nil {
		return
	}
	m.deliveries.WithLabelValues(pipe, result).Inc()
	if d > 0 {
		m.deliveryDuration.WithLabelValues(pipe).Observe(d.Seconds())
	}
}

// SetLeaseHeld records whether this replica holds the named lease.
func (m *Metrics) SetLeaseHeld(name string, held bool) {
	if m == nil {
		return
	}
	m.leaseHeld.WithLabelValues(name).Set(boolFloat(held))
}

// AddHandoffDroppedPending adds n changes the handoff buffer dropped
// before they were enqueued. The engine's handoff buffer counts them
// cumulatively per buffer: pass the difference since the last call.
func (m *Metrics) AddHandoffDroppedPending(n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.handoffDropped.Add(float64(n))
}

// DrainMetrics adapts the instruments to outbox.DrainerConfig.Metrics.
func (m *Metrics) DrainMetrics() outbox.DrainMetrics {
	if m == nil {
		return outbox.DrainMetrics{}
	}
	add := func(result string) func(pipe string, n int) {
		return func(pipe string, n int) { m.deliveries.WithLabelValues(pipe, result).Add(float64(n)) }
	}
	return outbox.DrainMetrics{
		Batch: func(pipe string, _ int, d time.Duration) {
			m.deliveryDuration.WithLabelValues(pipe).Observe(d.Seconds())
		},
		Delivered: add("delivered"),
		Retried:   add("retried"),
		Dead:      add("dead"),
		Latency: func(pipe string, d time.Duration) {
			m.deliveryLatency.WithLabelValues(pipe).Observe(d.Seconds())
		},
		Error: func(pipe, op string, _ error) { m.drainErrors.WithLabelValues(pipe, op).Inc() },
	}
}

// The status labels of cdcout_outbox_rows. OutboxDelivering is not a
// status column value: it counts pending records a drainer has claimed.
const (
	OutboxPending    = "pending"
	OutboxDelivering = "delivering"
	OutboxDelivered  = "delivered"
	OutboxDead       = "dead"
)

// OutboxStat is one pipe's record count in one status, read from the state
// database.
type OutboxStat struct {
	Pipe   string
	Status string
	// Records counts records: outbox rows plus the records still in
	// segments (enqueue writes a segment per transaction and pipe; only
	// records that fail or wait behind a retry become rows). The metric
	// it feeds keeps its name, cdcout_outbox_rows, so dashboards and
	// alerts carry on.
	Records int64
	// OldestPendingAge is set on the "pending" stat: how long the oldest
	// undelivered record (a row or a segment's) has waited in the outbox.
	OldestPendingAge time.Duration
}

// WatchOutbox registers cdcout_outbox_rows{pipe,status} and
// cdcout_outbox_oldest_pending_age_seconds{pipe}, computed by read on
// scrape; both count records, in rows and in segments alike. The result is cached for cacheFor (default 5s) so several
// scrapers, or a scrape storm, cost one GROUP BY. A failed read keeps the
// last good values (the scrape still succeeds; the error is counted as
// cdcout_drain_errors_total{op="outbox_stats"}). Calling it again replaces
// the reader.
func (m *Metrics) WatchOutbox(read func(ctx context.Context) ([]OutboxStat, error), cacheFor time.Duration) {
	if m == nil {
		return
	}
	if cacheFor <= 0 {
		cacheFor = 5 * time.Second
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.outbox != nil {
		m.outbox.mu.Lock()
		m.outbox.read, m.outbox.cacheFor, m.outbox.at = read, cacheFor, time.Time{}
		m.outbox.mu.Unlock()
		return
	}
	m.outbox = &outboxCollector{
		read:     read,
		cacheFor: cacheFor,
		errs:     m.drainErrors,
		rows: prometheus.NewDesc("cdcout_outbox_rows",
			"Records in the outbox (outbox rows and records in segments; the name says rows for compatibility) by pipe and status, read from the state database.", []string{"pipe", "status"}, nil),
		oldest: prometheus.NewDesc("cdcout_outbox_oldest_pending_age_seconds",
			"Age of the oldest undelivered outbox record (row or segment) of the pipe (0 when none is pending).", []string{"pipe"}, nil),
	}
	m.reg.MustRegister(m.outbox)
}

type outboxCollector struct {
	rows, oldest *prometheus.Desc
	errs         *prometheus.CounterVec

	mu       sync.Mutex
	read     func(ctx context.Context) ([]OutboxStat, error)
	cacheFor time.Duration
	at       time.Time
	last     []OutboxStat
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rows
	ch <- c.oldest
}

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	if time.Since(c.at) >= c.cacheFor {
		// The scrape's own deadline is unknown here; a slow state database
		// must not hang /metrics, so the read gets a short one.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		stats, err := c.read(ctx)
		cancel()
		if err != nil {
			c.errs.WithLabelValues("", "outbox_stats").Inc()
		} else {
			c.last = stats
		}
		c.at = time.Now()
	}
	stats := c.last
	c.mu.Unlock()

	oldest := map[string]float64{}
	for _, s := range stats {
		ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, float64(s.Records), s.Pipe, s.Status)
		if _, ok := oldest[s.Pipe]; !ok {
			oldest[s.Pipe] = 0
		}
		if s.Status == OutboxPending {
			oldest[s.Pipe] = s.OldestPendingAge.Seconds()
		}
	}
	for pipe, v := range oldest {
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, v, pipe)
	}
}

// EndpointStat is one sink endpoint's adaptive concurrency state.
type EndpointStat struct {
	Sink string
	sink.LimiterStats
}

// WatchEndpoints registers, per sink that paces itself (webhooks),
// cdcout_sink_concurrency_limit, cdcout_sink_inflight,
// cdcout_sink_rtt_seconds (smoothed), cdcout_sink_rtt_floor_seconds,
// cdcout_sink_paused_seconds and cdcout_sink_overloads_total, read from
// the sinks on scrape.
func (m *Metrics) WatchEndpoints(read func() []EndpointStat) {
	if m == nil || read == nil {
		return
	}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"sink"}, nil)
	}
	m.reg.MustRegister(&endpointCollector{
		read:      read,
		limit:     d("cdcout_sink_concurrency_limit", "Requests the sink's endpoint is allowed in flight now (adaptive)."),
		inflight:  d("cdcout_sink_inflight", "Requests in flight to the sink's endpoint."),
		rtt:       d("cdcout_sink_rtt_seconds", "Smoothed round-trip time of the endpoint's successful requests."),
		floor:     d("cdcout_sink_rtt_floor_seconds", "Lowest recent round-trip time of the endpoint (its unloaded latency)."),
		paused:    d("cdcout_sink_paused_seconds", "How much longer the endpoint is paused (Retry-After, or backing off a receiver that refuses every request)."),
		overloads: d("cdcout_sink_overloads_total", "Overload answers of the endpoint (429, 503, refused or timed-out connects, timeouts); not counted as delivery attempts where the request never reached the receiver."),
	})
}

type endpointCollector struct {
	read                                           func() []EndpointStat
	limit, inflight, rtt, floor, paused, overloads *prometheus.Desc
}

func (c *endpointCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.limit, c.inflight, c.rtt, c.floor, c.paused, c.overloads} {
		ch <- d
	}
}

func (c *endpointCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range c.read() {
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(e.Limit), e.Sink)
		ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(e.InFlight), e.Sink)
		ch <- prometheus.MustNewConstMetric(c.rtt, prometheus.GaugeValue, e.RTT.Seconds(), e.Sink)
		ch <- prometheus.MustNewConstMetric(c.floor, prometheus.GaugeValue, e.Floor.Seconds(), e.Sink)
		ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, e.PausedFor.Seconds(), e.Sink)
		ch <- prometheus.MustNewConstMetric(c.overloads, prometheus.CounterValue, float64(e.Overloads), e.Sink)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
