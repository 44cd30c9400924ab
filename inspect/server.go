// Package inspect serves a replica's health, metrics and state over HTTP:
// /healthz and /readyz for orchestrators, /metrics for Prometheus, /v1/*
// JSON for tools, and a self-contained dashboard page at /.
//
// Everything shown is read from the state database (scoped to this
// replica's --instance) or from the engine through the Deps functions, so
// every replica shows the same picture of the shared tables and its own
// picture of its source connection. No response carries a secret: the only
// one the server could see is the source DSN, which is redacted before it
// is rendered, and every body is additionally scrubbed of Deps.Secrets.
package inspect

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/internal/pause"
	"github.com/cdcout/cdcout/metrics"
	"github.com/cdcout/cdcout/replay"
)

// defaultKeepAlive is the idle keep-alive lifetime of a client connection.
//
// The bound that matters is the idle timeout of the proxy or load balancer
// in front of us, and those defaults cluster at 60s (AWS ALB, Envoy) and
// 75s (nginx). A server must keep an idle connection open LONGER than the
// proxy does, or the proxy reuses a connection we just closed and the
// request fails. 72s clears the 60s group with margin and sits just under
// nginx's; a deployment behind nginx should raise it (http_keep_alive).
// 76s instead would leave every ALB user holding connections the balancer
// already dropped — the same defect mirrored — and the 60s group is the
// larger one.
const defaultKeepAlive = 72 * time.Second

// headersTimeoutMargin is how much longer than the keep-alive the header
// deadline runs by default. The pairing comes from servers where the header
// timer starts with the connection's idle period, so a header deadline at or
// under the keep-alive cuts off a request that arrives just before the idle
// close. Go's http.Server starts ReadHeaderTimeout when a request begins, so
// the margin is not needed for that race here; we keep the documented
// relation (headers = keep-alive + 5s) so the two knobs mean the same as in
// the configuration reference, and it still bounds slow-header clients.
const headersTimeoutMargin = 5 * time.Second

// defaultStallAfter is the source lag beyond which /readyz reports the
// replica as stalled.
const defaultStallAfter = 5 * time.Minute

//go:embed dashboard.html
var dashboardFS embed.FS

// Config configures the server.
type Config struct {
	// Addr is host:port to listen on; "" or "off" disables the server (Run
	// then just waits for its context).
	Addr string
	// KeepAlive is the idle keep-alive timeout (default defaultKeepAlive).
	KeepAlive time.Duration
	// HeadersTimeout bounds reading a request's headers (default KeepAlive
	// + headersTimeoutMargin).
	HeadersTimeout time.Duration
	// StallAfter: /readyz fails while the connected source lags more than
	// this (default defaultStallAfter; negative disables the check).
	StallAfter time.Duration
	// RunwayMin: /readyz fails while the binlog runway (SourceStatus.Runway)
	// is shorter than this; 0 disables the check.
	RunwayMin time.Duration
	// StaleAfter is the fleet staleness threshold (default
	// fleet.DefaultStaleAfter).
	StaleAfter time.Duration
	// ShutdownTimeout bounds the graceful shutdown (default 5s).
	ShutdownTimeout time.Duration
	// Admin configures the write endpoints (admin.go).
	Admin AdminConfig
}

// SourceStatus is the engine's view of its binlog source.
type SourceStatus struct {
	// Connected: the binlog connection is up and streaming.
	Connected bool `json:"connected"`
	// Following: this replica is a standby waiting for the enqueue lease,
	// which is healthy without a binlog connection.
	Following bool `json:"following"`
	// Role is "leader" or "standby" (free text for display).
	Role     string          `json:"role,omitempty"`
	Position binlog.Position `json:"position"`
	// Lag is the commit → read delay of the last change (or heartbeat).
	Lag         time.Duration `json:"-"`
	LastEventAt time.Time     `json:"lastEventAt,omitzero"`
	// LastContactAt is when the server last spoke on the binlog
	// connection (an event or a heartbeat).
	LastContactAt time.Time `json:"lastContactAt,omitzero"`
	// IdentityMode is "gtid" or "digest" (how changes are identified).
	IdentityMode  string `json:"identityMode,omitempty"`
	Flavor        string `json:"flavor,omitempty"`
	ServerVersion string `json:"serverVersion,omitempty"`
	// MetadataMode is "binlog" or "information_schema".
	MetadataMode string `json:"metadataMode,omitempty"`
	// DSN is rendered redacted (user:[redacted]@tcp(…)); give the real
	// one, or none.
	DSN string `json:"dsn,omitempty"`
	// Error is the last connection error, if any.
	Error string `json:"error,omitempty"`
	// PreparedXA counts XA transactions prepared and held until their
	// outcome; the checkpoint cannot pass the oldest (since PreparedXASince).
	PreparedXA      int       `json:"preparedXA,omitempty"`
	PreparedXASince time.Time `json:"preparedXASince,omitzero"`
	// Runway is the last reading of how long the server keeps the binlog
	// file holding the checkpoint (nil until read); RunwayError why the
	// last reading failed. Rendered by runwayOf (runway.go).
	Runway      *binlog.Runway `json:"-"`
	RunwayError string         `json:"-"`
}

// Deps is what the server reads from.
type Deps struct {
	// DB is the state database; Schema its name.
	DB     *sql.DB
	Schema string
	// Instance scopes pipes, leases, checkpoint and fleet rows.
	Instance string
	// ReplicaID names this replica in the responses.
	ReplicaID string
	// Source reports the binlog source; nil reports not connected.
	Source func() SourceStatus
	// Ready, when set, is asked first by /readyz (e.g. "starting up").
	Ready func() (bool, string)
	// Metrics is served at /metrics; nil serves a fresh empty registry.
	// New registers the outbox gauges on it (metrics.WatchOutbox).
	Metrics *metrics.Metrics
	// Pipes, when set, lists configured pipes so ones without rows show.
	Pipes func() []string
	// DroppedPending, when set, is the handoff buffer's dropped count.
	DroppedPending func() int64
	// Endpoints, when set, reports the adaptive concurrency state of the
	// sinks that pace themselves, by sink name.
	Endpoints func() map[string]EndpointStatus
	// Sinks are this replica's configured sink names (pause and resume
	// accept them before any record or fleet row names them).
	Sinks []string
	// RequestBackfill, when set, checks a POST /v1/backfills request and
	// writes its signal (errors wrapping backfill.ErrBadInput are 400s).
	RequestBackfill func(context.Context, backfill.Signal) (backfill.Signal, error)
	// Secrets are scrubbed from every response body as a last line of
	// defence (the source DSN's password, sink secrets).
	Secrets []string
	Logger  *zap.Logger
}

// Server is the inspect HTTP server.
type Server struct {
	cfg    Config
	deps   Deps
	reader Reader
	log    *zap.Logger
	mux    *http.ServeMux
	// adminMux serves the write endpoints on Admin.Addr, when set.
	adminMux *http.ServeMux

	mu        sync.Mutex
	addr      net.Addr
	adminAddr net.Addr

	// pipes caches the /v1/sinks read for pipesCacheFor: counting an
	// outbox of a million delivered rows takes a fraction of a second, and
	// every open dashboard asks every two seconds.
	pipesMu    sync.Mutex
	pipesAt    time.Time
	pipesCache []PipeStatus

	history lagHistory // source lag samples (history.go)
}

const pipesCacheFor = time.Second

// New builds a Server; nothing listens until Run.
func New(cfg Config, deps Deps) *Server {
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = defaultKeepAlive
	}
	if cfg.HeadersTimeout <= 0 {
		cfg.HeadersTimeout = cfg.KeepAlive + headersTimeoutMargin
	}
	if cfg.StallAfter == 0 {
		cfg.StallAfter = defaultStallAfter
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	if deps.Logger == nil {
		deps.Logger = zap.NewNop()
	}
	if deps.Metrics == nil {
		deps.Metrics = metrics.New()
	}
	s := &Server{
		cfg:    cfg,
		deps:   deps,
		reader: Reader{DB: deps.DB, Schema: deps.Schema, Instance: deps.Instance, StaleAfter: cfg.StaleAfter},
		log:    deps.Logger.Named("inspect"),
		mux:    http.NewServeMux(),

		adminMux: http.NewServeMux(),
	}
	if deps.DB != nil {
		deps.Metrics.WatchOutbox(s.reader.OutboxStats, 5*time.Second)
	}
	s.routes()
	s.adminRoutes()
	return s
}

// Handler is the server's handler, for tests and for mounting elsewhere.
func (s *Server) Handler() http.Handler { return s.mux }

// Addr is the address the server listens on, nil before Run listened.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// AdminAddr is the address the admin listener listens on, nil before Run
// listened or without Admin.Addr.
func (s *Server) AdminAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.adminAddr
}

// Run listens on cfg.Addr (and Admin.Addr, when set) and serves until ctx
// ends, then shuts down gracefully (in-flight requests get
// ShutdownTimeout). With Addr "off" and no Admin.Addr it only waits for
// ctx.
func (s *Server) Run(ctx context.Context) error {
	var servers []*http.Server
	var listeners []net.Listener
	errc := make(chan error, 2)
	for _, l := range []struct {
		addr    string
		handler http.Handler
		got     *net.Addr
	}{{s.cfg.Addr, s.mux, &s.addr}, {s.cfg.Admin.Addr, s.adminMux, &s.adminAddr}} {
		if l.addr == "" || l.addr == "off" {
			continue
		}
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			// Close the listeners themselves: a Serve goroutine that has
			// not started yet would close its listener only when it runs.
			for i, srv := range servers {
				_ = srv.Close()
				_ = listeners[i].Close()
			}
			return fmt.Errorf("inspect: listen on %s: %w", l.addr, err)
		}
		s.mu.Lock()
		*l.got = ln.Addr()
		s.mu.Unlock()
		srv := &http.Server{
			Handler:           l.handler,
			IdleTimeout:       s.cfg.KeepAlive,
			ReadHeaderTimeout: s.cfg.HeadersTimeout,
			ErrorLog:          zap.NewStdLog(s.log),
		}
		servers, listeners = append(servers, srv), append(listeners, ln)
		s.log.Info("serving", zap.String("addr", ln.Addr().String()), zap.Bool("admin", l.handler == http.Handler(s.adminMux)))
		go func() { errc <- srv.Serve(ln) }()
	}
	if len(servers) == 0 {
		<-ctx.Done()
		return nil
	}
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s.history.add(time.Now(), s.source())
		_ = pause.Every(sctx, historyEvery, func() error {
			s.history.add(time.Now(), s.source())
			return nil
		})
	}()
	defer func() { stopSampling(); <-sampled }()
	select {
	case err := <-errc:
		return fmt.Errorf("inspect: serve: %w", err)
	case <-ctx.Done():
	}
	shctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	var err error
	for _, srv := range servers {
		if serr := srv.Shutdown(shctx); serr != nil && err == nil {
			err = serr
		}
	}
	for range servers {
		if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
	}
	if err != nil {
		return fmt.Errorf("inspect: shutdown: %w", err)
	}
	return nil
}

func (s *Server) routes() {
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		s.writeText(w, http.StatusOK, "ok\n")
	})
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.read("GET /metrics", s.metrics)
	s.read("GET /v1/source", func(w http.ResponseWriter, r *http.Request) {
		s.writeJSON(w, http.StatusOK, s.sourceView())
	})
	s.read("GET /v1/sinks", s.sinks)
	s.read("GET /v1/source/history", s.lagHistory)
	s.read("GET /v1/leases", func(w http.ResponseWriter, r *http.Request) {
		leases, err := s.reader.Leases(r.Context())
		s.reply(w, map[string]any{"instance": s.deps.Instance, "leases": leases}, err)
	})
	s.read("GET /v1/fleet", func(w http.ResponseWriter, r *http.Request) {
		f, err := s.reader.Fleet(r.Context())
		s.reply(w, f, err)
	})
	s.read("GET /v1/dead", func(w http.ResponseWriter, r *http.Request) {
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		dead, err := s.reader.Dead(r.Context(), limit)
		s.reply(w, map[string]any{"instance": s.deps.Instance, "dead": dead}, err)
	})
	// The page holds no data (it fetches /v1/*), so it stays open under
	// ReadAuth and sends the token from its URL fragment.
	s.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		page, err := dashboardFS.ReadFile("dashboard.html")
		if err != nil {
			http.Error(w, "dashboard missing from the build", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		// The page is self-contained: no script or style from anywhere else.
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:")
		_, _ = w.Write(s.scrub(page))
	})
}

// sourceView is SourceStatus as JSON, with the DSN redacted and the lag
// in seconds.
type sourceView struct {
	SourceStatus
	Instance     string      `json:"instance"`
	ReplicaID    string      `json:"replicaId,omitempty"`
	LagSeconds   float64     `json:"lagSeconds"`
	BinlogRunway *RunwayView `json:"binlogRunway,omitempty"`
}

func (s *Server) source() SourceStatus {
	if s.deps.Source == nil {
		return SourceStatus{}
	}
	return s.deps.Source()
}

func (s *Server) sourceView() sourceView {
	src := s.source()
	if src.DSN != "" {
		src.DSN = config.RedactDSN(src.DSN)
	}
	return sourceView{SourceStatus: src, Instance: s.deps.Instance, ReplicaID: s.deps.ReplicaID, LagSeconds: src.Lag.Seconds(),
		BinlogRunway: runwayView(src, time.Now())}
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	var reasons []string
	if s.deps.Ready != nil {
		if ok, why := s.deps.Ready(); !ok {
			reasons = append(reasons, why)
		}
	}
	src := s.source()
	if !src.Connected && !src.Following {
		why := "binlog not connected"
		if src.Error != "" {
			why += ": " + src.Error
		}
		reasons = append(reasons, why)
	}
	if src.Connected && s.cfg.StallAfter > 0 && src.Lag > s.cfg.StallAfter {
		reasons = append(reasons, fmt.Sprintf("stalled: source lag %s exceeds %s", src.Lag.Round(time.Second), s.cfg.StallAfter))
	}
	if why := s.runwayShort(src, time.Now()); why != "" {
		reasons = append(reasons, why)
	}
	if s.deps.DB == nil {
		reasons = append(reasons, "no state database")
	} else {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		err := s.deps.DB.PingContext(ctx)
		cancel()
		if err != nil {
			reasons = append(reasons, "state database unreachable: "+err.Error())
		}
	}
	if len(reasons) > 0 {
		s.writeText(w, http.StatusServiceUnavailable, "not ready: "+strings.Join(reasons, "; ")+"\n")
		return
	}
	s.writeText(w, http.StatusOK, "ready\n")
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	// The source gauges are sampled at scrape time, so the engine need not
	// push them on every event.
	if s.deps.Source != nil {
		src := s.source()
		s.deps.Metrics.SetSourceConnected(src.Connected)
		if !src.Following {
			// Down, the lag grows by the silence (the engine adds it).
			s.deps.Metrics.SetSourceLag(src.Lag)
		}
		if src.Runway != nil {
			s.deps.Metrics.SetBinlogRunway(src.Runway.Seconds(time.Now()), true)
		} else {
			s.deps.Metrics.SetBinlogRunway(0, false)
		}
	}
	s.deps.Metrics.Handler().ServeHTTP(w, r)
}

// sinksView is the /v1/sinks body.
type sinksView struct {
	Instance string `json:"instance"`
	// DroppedPending counts changes the handoff buffer dropped during
	// leadership gaps (re-read from the checkpoint by the next leader);
	// per replica, not per pipe, since the buffer holds every pipe's.
	DroppedPending int64        `json:"droppedPending"`
	Pipes          []PipeStatus `json:"pipes"`
	// Replays are the running replays and the latest finished ones.
	Replays []replay.Status `json:"replays,omitempty"`
}

func (s *Server) sinks(w http.ResponseWriter, r *http.Request) {
	var extra []string
	if s.deps.Pipes != nil {
		extra = s.deps.Pipes()
	}
	pipes, err := s.cachedPipes(r.Context(), extra)
	if s.deps.Endpoints != nil && len(pipes) > 0 {
		eps := s.deps.Endpoints()
		// A copy: the cached slice is shared between requests.
		pipes = append([]PipeStatus(nil), pipes...)
		for i := range pipes {
			if ep, ok := eps[pipes[i].Sink]; ok {
				pipes[i].Endpoint = &ep
			}
		}
	}
	v := sinksView{Instance: s.deps.Instance, Pipes: pipes}
	if err == nil {
		v.Replays, err = s.reader.Replays(r.Context())
	}
	if s.deps.DroppedPending != nil {
		v.DroppedPending = s.deps.DroppedPending()
	}
	s.reply(w, v, err)
}

func (s *Server) cachedPipes(ctx context.Context, extra []string) ([]PipeStatus, error) {
	s.pipesMu.Lock()
	defer s.pipesMu.Unlock()
	if s.pipesCache != nil && time.Since(s.pipesAt) < pipesCacheFor {
		return s.pipesCache, nil
	}
	pipes, err := s.reader.Pipes(ctx, extra...)
	if err != nil {
		return nil, err
	}
	s.pipesCache, s.pipesAt = pipes, time.Now()
	return pipes, nil
}

// forgetPipes drops the cached /v1/sinks read, so that a change an
// operator just made (a pause, a replay) shows at once.
func (s *Server) forgetPipes() {
	s.pipesMu.Lock()
	s.pipesCache = nil
	s.pipesMu.Unlock()
}

func (s *Server) reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		s.log.Warn("read state", zap.Error(err))
		s.writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	s.writeJSON(w, http.StatusOK, v)
}

func (s *Server) writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"encode response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(s.scrub(b), '\n'))
}

func (s *Server) writeText(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(s.scrub([]byte(text)))
}

// scrub redacts by structure (config.RedactText): DSN and URL passwords,
// and the secret values long enough not to occur by chance. A plain
// substring search for every secret would mangle bodies around a short
// password.
func (s *Server) scrub(b []byte) []byte {
	return []byte(config.RedactText(string(b), s.deps.Secrets...))
}
