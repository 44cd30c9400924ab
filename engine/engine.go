// Package engine wires one cdcout replica: it reads the source's binlog,
// routes each change to the sinks that subscribe to it, writes outbox rows
// and the checkpoint in one transaction under the enqueue lease, and runs
// the drainers that deliver the rows.
//
// Run owns every goroutine it starts (stream, flush ticker, lease keeper,
// drainers) and waits for each before it returns. A cancelled context is a
// graceful stop: reading stops, the complete transactions still buffered
// are written with their checkpoint, deliveries in flight finish (bounded by
// the shutdown timeout) and the lease is released.
package engine

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/control"
	"github.com/cdcout/cdcout/dedup"
	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/internal/buildinfo"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/metrics"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
	"github.com/cdcout/cdcout/sink/filesink"
	"github.com/cdcout/cdcout/sink/httpsink"
	"github.com/cdcout/cdcout/sink/kafkasink"
	"github.com/cdcout/cdcout/sink/natssink"
	"github.com/cdcout/cdcout/sink/stdoutsink"
	"github.com/cdcout/cdcout/state"
)

// counterMaxEntries bounds the digest-mode occurrence counter (about 150
// bytes an entry).
const counterMaxEntries = 200_000

// Option adjusts an Engine.
type Option func(*Engine)

// WithStdout sets where stdout: sinks write (default os.Stdout).
func WithStdout(w io.Writer) Option { return func(e *Engine) { e.stdout = w } }

// Engine is one replica.
type Engine struct {
	cfg    *config.Config
	log    *zap.Logger
	stdout io.Writer

	holder string // "<replica-id>/<boot nonce>"
	// roleChanged wakes the fleet heartbeat when leader/standby flips.
	roleChanged chan struct{}
	leaseName   string // "enqueue/<instance>"
	routes      []*route
	sinks       map[string]sinkEntry
	closers     []io.Closer

	metrics *metrics.Metrics

	mu     sync.Mutex
	enq    *enqueuer      // current tenure's, for Stats
	stream *binlog.Stream // current tenure's, for the inspect endpoints
	digest bool
	// role is "leader" while this replica holds the enqueue lease.
	role string
	// ho is the current (or last) standby phase's handoff buffer;
	// droppedBefore sums the earlier phases' DroppedPending, and
	// droppedReported is what the metric was told.
	ho              *handoff
	dl              *drainLeases
	droppedBefore   int64
	droppedReported int64
	started         time.Time
	// lag is commit → read of the last transaction the leader read, at
	// lastEventAt (Debezium's "behind source"); it feeds /readyz's stall
	// check, /v1/source and cdcout_source_lag_seconds.
	lag         time.Duration
	lastEventAt time.Time
	// writeFails are the state writes whose latest attempt failed, by
	// what they are for (readiness: a replica that cannot write its
	// leases, outbox rows or checkpoint is not making progress).
	writeFails map[string]writeFailure
}

// writeFailure is the first of a run of failed attempts of one write.
type writeFailure struct {
	since time.Time
	err   string
}

// Kinds of state writes readiness watches.
const (
	writeEnqueueLease = "enqueue lease"
	writeRenewal      = "enqueue lease renewal"
	writeEnqueue      = "enqueue (outbox rows and checkpoint)"
	writeMember       = "member lease"
)

// noteWrite records the outcome of one attempt of a state write.
func (e *Engine) noteWrite(what string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil {
		delete(e.writeFails, what)
		return
	}
	if e.writeFails == nil {
		e.writeFails = map[string]writeFailure{}
	}
	f, ok := e.writeFails[what]
	if !ok {
		f.since = time.Now()
	}
	f.err = err.Error()
	e.writeFails[what] = f
}

// ready is /readyz's engine check: unready while a state write this
// replica needs keeps failing (grants revoked, read-only, full disk), with
// what failed, since when and why. A ping alone would pass all of these.
func (e *Engine) ready() (bool, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.writeFails) == 0 {
		return true, ""
	}
	whats := make([]string, 0, len(e.writeFails))
	for w := range e.writeFails {
		whats = append(whats, w)
	}
	sort.Strings(whats)
	var b strings.Builder
	b.WriteString("state database refuses writes: ")
	for i, w := range whats {
		if i > 0 {
			b.WriteString("; ")
		}
		f := e.writeFails[w]
		fmt.Fprintf(&b, "%s failing for %s: %s", w, time.Since(f.since).Round(time.Second), f.err)
	}
	return false, b.String()
}

type sinkEntry struct {
	cfg  config.Sink
	sink outbox.Sink
}

// New validates cfg and builds the sinks. Nothing connects to a database
// until Run.
func New(cfg *config.Config, logger *zap.Logger, opts ...Option) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	nonce := make([]byte, 6)
	_, _ = rand.Read(nonce)
	e := &Engine{
		cfg:       cfg,
		log:       logger.Named("engine"),
		stdout:    os.Stdout,
		holder:    cfg.ReplicaID + "/" + hex.EncodeToString(nonce),
		leaseName: "enqueue/" + cfg.Instance,
		sinks:     map[string]sinkEntry{},
		metrics:   metrics.New(),
		role:      "standby",
		started:   time.Now(),

		roleChanged: make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(e)
	}
	for i, sc := range cfg.Sinks {
		s, err := e.buildSink(sc)
		if err != nil {
			e.closeSinks()
			return nil, fmt.Errorf("sinks[%d] (%s): %w", i, sc.Name, err)
		}
		e.sinks[sc.Name] = sinkEntry{cfg: sc, sink: s}
		e.routes = append(e.routes, newRoute(sc))
	}
	e.metrics.WatchEndpoints(e.endpointStats)
	return e, nil
}

// buildSink selects the sink type by URL scheme. One package per external
// client; an explicit switch, no registry.
func (e *Engine) buildSink(sc config.Sink) (outbox.Sink, error) {
	f, err := format.New(sc.Format)
	if err != nil {
		return nil, err
	}
	scheme, _, _ := strings.Cut(sc.URL, ":")
	switch strings.ToLower(scheme) {
	case "stdout":
		return stdoutsink.New(e.stdout, f), nil
	case "file":
		p, err := filesink.PathOf(sc.URL)
		if err != nil {
			return nil, err
		}
		s, err := filesink.Open(p, f)
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, s)
		return s, nil
	case "http", "https":
		secret, err := httpsink.ParseSecret(sc.Secret.Value())
		if err != nil {
			return nil, err
		}
		headers := map[string]string{}
		for k, v := range sc.Headers {
			headers[k] = v.Value()
		}
		o := httpsink.Options{URL: sc.URL, Secret: secret, Headers: headers, Format: f, Timeout: sc.Timeout,
			Logger: e.log.Named("http").With(zap.String("sink", sc.Name))}
		if sc.HTTP != nil {
			o.Batch, o.MaxConcurrency = sc.HTTP.Batch, sc.HTTP.MaxConcurrency
		}
		return httpsink.New(o)
	case "kafka":
		brokers, topic, err := kafkasink.ParseURL(sc.URL)
		if err != nil {
			return nil, err
		}
		o := kafkasink.Options{Brokers: brokers, TopicTemplate: topic, Format: sc.Format, Logger: e.log}
		if k := sc.Kafka; k != nil {
			if t := k.TLS; t != nil {
				o.TLS = &kafkasink.TLSOptions{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, InsecureSkipVerify: t.InsecureSkipVerify}
			}
			if a := k.SASL; a != nil {
				o.SASL = &kafkasink.SASLOptions{Mechanism: a.Mechanism, Username: a.Username, Password: a.Password.Value()}
			}
		}
		s, err := kafkasink.New(context.Background(), o)
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, closerFunc(s.Close))
		return s, nil
	case "nats":
		server, subject, err := natssink.ParseURL(sc.URL)
		if err != nil {
			return nil, err
		}
		o := natssink.Options{URL: server, SubjectTemplate: subject, Format: sc.Format, Logger: e.log}
		if n := sc.NATS; n != nil {
			o.CredentialsFile, o.User, o.Password, o.Token = n.CredentialsFile, n.User, n.Password.Value(), n.Token.Value()
			if t := n.TLS; t != nil {
				o.TLS = &natssink.TLSOptions{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, InsecureSkipVerify: t.InsecureSkipVerify}
			}
		}
		s, err := natssink.New(context.Background(), o)
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, closerFunc(s.Close))
		return s, nil
	default:
		return nil, fmt.Errorf("unknown sink scheme %q", scheme)
	}
}

// closerFunc adapts a sink's Close without a result to io.Closer.
type closerFunc func()

func (f closerFunc) Close() error { f(); return nil }

func (e *Engine) closeSinks() {
	for _, c := range e.closers {
		if err := c.Close(); err != nil {
			e.log.Warn("close sink", zap.Error(err))
		}
	}
	e.closers = nil
}

// Holder is this process's lease holder and drain claim id.
func (e *Engine) Holder() string { return e.holder }

// Run runs the replica until ctx ends (returning nil after a graceful stop)
// or a fatal error.
func (e *Engine) Run(parent context.Context) error {
	defer e.closeSinks()
	cfg := e.cfg
	// ctx also ends when the inspect server cannot serve (address in use):
	// the replica then stops as gracefully as on a signal and reports why.
	ctx, stopRun := context.WithCancel(parent)
	defer stopRun()
	serveErr := make(chan error, 1)
	// A source whose binary log cdcout can never read is refused before
	// the state database is created or migrated (by default it lives on
	// that same server). A source that does not answer yet is only
	// logged: the stream retries it.
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	err := binlog.Preflight(pctx, cfg.DSN.Value())
	pcancel()
	switch {
	case err == nil || ctx.Err() != nil:
	case errors.Is(err, binlog.ErrServerNotReady) || refused(err):
		// No retry can fix these (wrong password, no access, unknown
		// database, binary log off): stop now instead of promising one.
		return err
	case sameServer(cfg.DSN.Value(), cfg.EffectiveStateDSN().Value()):
		// The state database lives there too, and cdcout cannot start
		// without it: saying the stream will keep trying would be untrue.
		return fmt.Errorf("source (and state database) not reachable: %w", err)
	default:
		e.log.Warn("source not reachable yet; the stream will keep trying", zap.Error(err))
	}
	db, err := openDB(cfg.EffectiveStateDSN().Value(), cfg.LeaseTTL)
	if err != nil {
		return fmt.Errorf("state database %s: %w", config.DSNAddr(cfg.EffectiveStateDSN().Value()), err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("connect to state database %s: %w", config.DSNAddr(cfg.EffectiveStateDSN().Value()), err)
	}
	if err := state.Migrate(ctx, db, cfg.StateDB); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	store := outbox.NewStore(db, cfg.StateDB, e.log)
	leases := lease.NewManager(db, cfg.StateDB)

	srv := inspect.New(inspect.Config{Addr: cfg.HTTPAddr, KeepAlive: cfg.HTTPKeepAlive, HeadersTimeout: cfg.HTTPHeadersTimeout,
		Admin: inspect.AdminConfig{Token: cfg.AdminTokenValue(), Addr: cfg.AdminAddr, ReadAuth: cfg.AdminReadAuth}}, inspect.Deps{
		DB: db, Schema: cfg.StateDB, Instance: cfg.Instance, ReplicaID: cfg.ReplicaID,
		Source: e.sourceStatus, Ready: e.ready, Metrics: e.metrics, Pipes: nil,
		DroppedPending: e.droppedPending, Endpoints: e.endpoints, Sinks: e.sinkNames(),
		Secrets: e.secrets(), Logger: e.log,
	})
	ictx, stopInspect := context.WithCancel(context.WithoutCancel(ctx))
	inspectDone := make(chan struct{})
	go func() {
		defer close(inspectDone)
		if err := srv.Run(ictx); err != nil && ictx.Err() == nil {
			serveErr <- err
			stopRun()
		}
	}()
	// The inspect server outlives the stop sequence so /readyz and metrics
	// answer until the end.
	defer func() { stopInspect(); <-inspectDone }()

	// Drainers run for the whole Run, across enqueue tenures: delivery
	// does not depend on who enqueues.
	dctx, stopDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDrain()
	drains := newDrainers(dctx, db, cfg, e.holder, e.sinks, e.log)
	drains.metrics = e.metrics.DrainMetrics()
	// Drain leases spread the pipes over the live replicas; a drainer
	// claims rows only while its pipe's lease is held. They are renewed
	// until the drainers have returned, then released.
	dl := newDrainLeases(leases, db, cfg.StateDB, cfg.Instance, cfg.ReplicaID, e.holder, cfg.LeaseTTL, e.log)
	dl.acquired = func(p string) { drains.written([]string{p}) }
	dl.discover = drains.pendingPipes
	dl.heldMetric = e.metrics.SetLeaseHeld
	dl.reportMember = func(err error) { e.noteWrite(writeMember, err) }
	paused, err := control.Watch(ctx, db, cfg.StateDB, cfg.Instance, e.log, drains.wakeSink)
	if err != nil {
		return err
	}
	defer paused.Stop()
	drains.leases = pauseGate(paused, dl.get)
	drains.notify = dl.addPipes
	e.mu.Lock()
	e.dl = dl
	e.mu.Unlock()
	lctx, stopLeases := context.WithCancel(context.WithoutCancel(ctx))
	leasesDone := make(chan struct{})
	go func() { defer close(leasesDone); dl.run(lctx) }()
	defer func() {
		stopLeases()
		<-leasesDone
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		dl.releaseAll(rctx)
		rcancel()
	}()
	if err := drains.discover(ctx); err != nil && ctx.Err() == nil {
		e.log.Warn("look up pipes with pending rows", zap.Error(err))
	}

	// The fleet observation: who this replica is and what it holds.
	hctx, stopHeartbeat := context.WithCancel(ctx)
	heartbeatDone := make(chan struct{})
	hb := &fleet.Heartbeat{DB: db, Schema: cfg.StateDB, Every: heartbeatEvery(cfg.LeaseTTL), Observe: e.observation, Logger: e.log, Changed: e.roleChanged,
		Final: e.stoppedObservation}
	go func() { defer close(heartbeatDone); _ = hb.Run(hctx) }()
	defer func() { stopHeartbeat(); <-heartbeatDone }()
	// Drainers stop claiming as soon as the stop is asked for.
	stopWatch := context.AfterFunc(ctx, drains.stopClaiming)
	defer stopWatch()

	janitor, err := outbox.NewJanitor(outbox.JanitorConfig{
		DB:          db,
		Schema:      cfg.StateDB,
		Retention:   time.Duration(cfg.RetentionHours) * time.Hour,
		DedupWindow: cfg.EffectiveDedupWindow(),
		Logger:      e.log,
	})
	if err != nil {
		return err
	}
	jctx, stopJanitor := context.WithCancel(ctx)
	defer stopJanitor()
	janitorDone := make(chan struct{})
	go func() {
		defer close(janitorDone)
		if err := janitor.Run(jctx); err != nil && jctx.Err() == nil {
			e.log.Error("janitor stopped", zap.Error(err))
		}
	}()
	defer func() { stopJanitor(); <-janitorDone }()

	resetPending := cfg.ResetPosition
	var runErr error
	for ctx.Err() == nil {
		l, ho, err := e.acquire(ctx, leases, store)
		if err != nil {
			if ctx.Err() == nil {
				runErr = err
			}
			break
		}
		err = e.tenure(ctx, db, l, leases, store, drains, &resetPending, ho)
		if errors.Is(err, errLeaseLost) {
			e.log.Warn("enqueue lease lost; stopped enqueueing, following as a standby", zap.Error(err))
			continue
		}
		if errors.Is(err, errReread) {
			e.log.Info("re-reading from the checkpoint", zap.Error(err))
			continue
		}
		if err != nil && ctx.Err() == nil && transient(err) {
			// The database went away (restart, network): the lease is
			// released or lapses, and any replica (this one too) resumes
			// from the checkpoint once it is back.
			e.log.Warn("enqueue stopped by a database error; retrying", zap.Error(err))
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		if err != nil && ctx.Err() == nil {
			runErr = err
		}
		break
	}
	drains.stopClaiming()
	if !drains.wait(cfg.ShutdownTimeout) {
		e.log.Warn("deliveries still in flight after the shutdown timeout; their rows are redelivered after the claim lease",
			zap.Duration("shutdown_timeout", cfg.ShutdownTimeout))
	} else {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		if n, err := drains.releaseOrphans(rctx); err != nil {
			e.log.Warn("release claims", zap.Error(err))
		} else if n > 0 {
			e.log.Info("released claimed rows that were never delivered", zap.Int64("rows", n))
		}
		rcancel()
	}
	select {
	case err := <-serveErr:
		if runErr == nil {
			runErr = err
		}
	default:
	}
	return runErr
}

// secrets lists what the inspect server must never echo.
func (e *Engine) secrets() []string {
	var out []string
	if t := e.cfg.AdminTokenValue(); t != "" {
		out = append(out, t.Value())
	}
	for _, dsn := range []config.DSN{e.cfg.DSN, e.cfg.StateDSN} {
		if mc, err := mysql.ParseDSN(dsn.Value()); err == nil && mc.Passwd != "" {
			out = append(out, mc.Passwd)
		}
	}
	for _, s := range e.cfg.Sinks {
		for _, sec := range []config.Secret{s.Secret} {
			if sec != "" {
				out = append(out, sec.Value())
			}
		}
		for _, h := range s.Headers {
			out = append(out, h.Value())
		}
		if s.Kafka != nil && s.Kafka.SASL != nil && s.Kafka.SASL.Password != "" {
			out = append(out, s.Kafka.SASL.Password.Value())
		}
		if s.NATS != nil {
			for _, sec := range []config.Secret{s.NATS.Password, s.NATS.Token} {
				if sec != "" {
					out = append(out, sec.Value())
				}
			}
		}
	}
	return out
}

// observeEvent counts a change read by the leader and, at a commit,
// records how far behind the source it is (commit time → now; the commit
// time has the binlog header's whole-second resolution).
func (e *Engine) observeEvent(ev binlog.Event) {
	if ch := ev.Change; ch != nil {
		e.metrics.ObserveChange(ch.Source.DB, ch.Source.Table, string(ch.Op))
		return
	}
	if ev.Commit == nil || ev.Commit.Time.IsZero() {
		return
	}
	now := time.Now()
	lag := max(now.Sub(ev.Commit.Time), 0)
	e.mu.Lock()
	e.lag, e.lastEventAt = lag, now
	st := e.stream
	e.mu.Unlock()
	e.metrics.SetSourceLag(lag)
	if st != nil {
		e.metrics.SetPreparedXA(st.PreparedXA())
	}
}

// sourceStatus reports the binlog source to the inspect server.
func (e *Engine) sourceStatus() inspect.SourceStatus {
	e.mu.Lock()
	st, digest, lag, lastEventAt := e.stream, e.digest, e.lag, e.lastEventAt
	e.mu.Unlock()
	if st == nil {
		return inspect.SourceStatus{Following: true, Role: "standby", DSN: e.cfg.DSN.String()}
	}

	info := st.Info()
	mode := "gtid"
	if digest {
		mode = "digest"
	}
	// Connected and lag follow the stream's last contact with the server
	// (heartbeats count), not the existence of a stream object: while the
	// link is down the lag keeps growing by the silence, so the stall
	// check and cdcout_source_lag_seconds see an outage too.
	h := st.Health()
	if !h.Connected && !h.LastContact.IsZero() {
		lag += time.Since(h.LastContact)
	}
	xa, xaSince := st.PreparedXA()
	return inspect.SourceStatus{
		Connected: h.Connected, Role: "leader", Position: st.Position(), IdentityMode: mode,
		Lag: lag, LastEventAt: lastEventAt, LastContactAt: h.LastContact, Error: h.Error,
		Flavor: info.Flavor, ServerVersion: info.Version, MetadataMode: info.MetadataMode,
		DSN:        e.cfg.DSN.String(),
		PreparedXA: xa, PreparedXASince: xaSince,
	}
}

// openDB opens the state database through state.Open: UTC sessions,
// MINIMAL row images where the user may set them, and a server-side idle
// limit of one lease TTL, so a replica frozen inside a transaction loses
// its locks about when it loses its lease instead of blocking the takeover.
func openDB(dsn string, leaseTTL time.Duration) (*sql.DB, error) {
	p, err := state.Open(dsn, leaseTTL)
	if err != nil {
		return nil, err
	}
	p.SetMaxOpenConns(32)
	p.SetMaxIdleConns(32)
	return p.DB, nil
}

// acquire waits until this replica holds the enqueue lease. While it
// waits it is a standby: it streams too, into a handoff buffer the
// returned handoff carries to the tenure (nil when it took the lease at
// the first try). It retries every half second to second (jittered, at
// most a third of the TTL), so a released lease is taken within about a
// second and a dead holder's within about a TTL.
func (e *Engine) acquire(ctx context.Context, leases *lease.Manager, store *outbox.Store) (lease.Lease, *handoff, error) {
	ttl := e.cfg.LeaseTTL
	logged := false
	var (
		ho         *handoff
		stopFollow context.CancelFunc
		followDone chan struct{}
	)
	stop := func() {
		if stopFollow != nil {
			stopFollow()
			<-followDone
			stopFollow = nil
		}
	}
	defer stop()
	for {
		l, ok, err := leases.Acquire(ctx, e.leaseName, e.holder, ttl)
		if ctx.Err() == nil {
			e.noteWrite(writeEnqueueLease, err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return lease.Lease{}, nil, ctx.Err()
			}
			e.log.Warn("acquire enqueue lease", zap.Error(err))
		} else if ok {
			// A new tenure: the last one's failures are history.
			e.noteWrite(writeRenewal, nil)
			e.noteWrite(writeEnqueue, nil)
			stop()
			e.log.Info("enqueue lease acquired", zap.String("lease", l.Name), zap.Uint64("epoch", l.Epoch), zap.String("holder", l.Holder))
			e.metrics.SetLeaseHeld(l.Name, true)
			e.reportDropped()
			return l, ho, nil
		} else if !logged {
			e.log.Info("enqueue lease held by another replica; following as a standby", zap.String("lease", e.leaseName), zap.String("holder", l.Holder))
			logged = true
		}
		if ho == nil {
			ho = newHandoff(e.handoffWindow(), e.cfg.HandoffBufferSize)
			e.mu.Lock()
			if e.ho != nil {
				e.droppedBefore += e.ho.droppedPending()
			}
			e.ho = ho
			e.mu.Unlock()
			fctx, cancel := context.WithCancel(ctx)
			stopFollow, followDone = cancel, make(chan struct{})
			go func() {
				defer close(followDone)
				e.follow(fctx, ho, func(c context.Context) (*binlog.Position, error) { return store.LoadCheckpoint(c, e.leaseName) })
			}()
		}
		e.reportDropped()
		t := time.NewTimer(acquireEvery(ttl))
		select {
		case <-ctx.Done():
			t.Stop()
			return lease.Lease{}, nil, ctx.Err()
		case <-t.C:
		}
	}
}

// acquireEvery is a standby's retry interval: 0.5–1 s, at most a third
// of the TTL, jittered so standbys do not ask in step.
func acquireEvery(ttl time.Duration) time.Duration {
	base := max(min(ttl/3, time.Second), 20*time.Millisecond)
	return base/2 + mrand.N(base/2+1)
}

// signalRoleChange asks the fleet heartbeat for a prompt write.
func (e *Engine) signalRoleChange() {
	select {
	case e.roleChanged <- struct{}{}:
	default:
	}
}

// heartbeatEvery is how often the fleet observation is written: the
// fleet default, or faster with a short lease TTL.
func heartbeatEvery(ttl time.Duration) time.Duration {
	return max(min(fleet.DefaultWriteEvery, 2*ttl), time.Second)
}

// handoffWindow is the handoff buffer's age bound: the dedup window, so a
// buffered change is never older than the claims that collapse it.
func (e *Engine) handoffWindow() time.Duration { return e.cfg.EffectiveDedupWindow() }

// droppedPending is what the handoff buffers could not carry.
func (e *Engine) droppedPending() int64 {
	e.mu.Lock()
	ho, n := e.ho, e.droppedBefore
	e.mu.Unlock()
	if ho != nil {
		n += ho.droppedPending()
	}
	return n
}

func (e *Engine) reportDropped() {
	n := e.droppedPending()
	e.mu.Lock()
	d := n - e.droppedReported
	e.droppedReported = n
	e.mu.Unlock()
	if d > 0 {
		e.metrics.AddHandoffDroppedPending(d)
	}
}

// servedSinks says which sinks this replica delivers to and what reaches
// each (names and table patterns only: never a URL, which may hold a
// credential).
func (e *Engine) servedSinks() []inspect.ServedSink {
	out := make([]inspect.ServedSink, 0, len(e.cfg.Sinks))
	for _, s := range e.cfg.Sinks {
		out = append(out, inspect.ServedSink{Name: s.Name, Capture: e.cfg.Tables, Include: s.Tables.Include, Exclude: s.Tables.Exclude, Ops: s.Ops})
	}
	return out
}

// stoppedObservation is the fleet row a stopping replica leaves behind:
// role "stopped", no drain leases.
func (e *Engine) stoppedObservation() fleet.Observation {
	o := e.observation()
	if info, ok := o.Payload.(inspect.EngineInfo); ok {
		info.Role, info.DrainLeases = inspect.RoleStopped, 0
		o.Payload = info
	}
	return o
}

// observation is this replica's fleet row.
func (e *Engine) observation() fleet.Observation {
	e.mu.Lock()
	role, dl := e.role, e.dl
	e.mu.Unlock()
	n := 0
	if dl != nil {
		n = dl.count()
	}
	reach := ""
	if host, _, ok := strings.Cut(e.cfg.HTTPAddr, ":"); ok && host != "" && host != "0.0.0.0" && host != "[::]" {
		reach = e.cfg.HTTPAddr
	}
	return fleet.Observation{
		ReplicaID: e.cfg.ReplicaID, Kind: fleet.KindEngine, StartedAt: e.started, Version: buildinfo.Version(),
		Payload:     inspect.EngineInfo{Instance: e.cfg.Instance, Holder: e.holder, Role: role, DrainLeases: n, Sinks: e.servedSinks()},
		ReachableAt: reach,
	}
}

// streamConfig is the binlog configuration of this replica's stream.
func (e *Engine) streamConfig(resume *binlog.Position) binlog.Config {
	cfg := e.cfg
	return binlog.Config{
		DSN:        cfg.DSN.Value(),
		ServerID:   e.serverID(),
		From:       cfg.From,
		Resume:     resume,
		Include:    withWatermarkTable(e.captureTables(), backfill.WatermarkDB(cfg.StateDB)+"."+backfill.WatermarkTable),
		ExcludeDBs: []string{cfg.StateDB},
		// The watermark database carries cdcout's marker: without this
		// the stream would not decode this instance's own watermarks.
		OwnMarkedDBs: []string{backfill.WatermarkDB(cfg.StateDB)},
		Instance:     cfg.Instance,
		Version:      buildinfo.Version(),
		Logger:       e.log,
		OnTableDDL:   func(d binlog.TableDDL) { e.metrics.ObserveTableDDL(d.DB+"."+d.Table, d.Statement) },
	}
}

// tenure is one term as the enqueue lease holder: read from the
// checkpoint and enqueue until ctx ends or the lease is lost.
func (e *Engine) tenure(ctx context.Context, db *sql.DB, l lease.Lease, leases *lease.Manager, store *outbox.Store, drains *drainers, resetPending *bool, ho *handoff) (err error) {
	cfg := e.cfg
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	keeper := leases.NewKeeper(l, e.log)
	keeper.OnRenew = func(err error) { e.noteWrite(writeRenewal, err) }
	var lost bool
	var wg sync.WaitGroup
	var lostMu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := keeper.Run(tctx); errors.Is(err, lease.ErrNotHeld) {
			lostMu.Lock()
			lost = true
			lostMu.Unlock()
			cancel()
		}
	}()
	defer func() {
		cancel()
		wg.Wait()
		e.metrics.SetLeaseHeld(l.Name, false)
		e.mu.Lock()
		e.stream, e.role = nil, "standby"
		e.metrics.SetSourceConnected(false)
		e.signalRoleChange()
		e.mu.Unlock()
		lostMu.Lock()
		wasLost := lost
		lostMu.Unlock()
		if wasLost && err == nil || wasLost && errors.Is(err, context.Canceled) {
			err = fmt.Errorf("%w: %v", errLeaseLost, keeper.Err())
		}
		if !wasLost && !errors.Is(err, errLeaseLost) {
			rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
			if rerr := leases.Release(rctx, keeper.Lease()); rerr != nil && !errors.Is(rerr, lease.ErrNotHeld) {
				e.log.Warn("release enqueue lease", zap.Error(rerr))
			}
			rcancel()
		}
	}()

	// A new leader's ids must sort after the previous leader's.
	if err := store.RaiseIDFloor(tctx); err != nil {
		return err
	}
	if *resetPending {
		e.log.Warn("--reset-position: DISCARDING the stored checkpoint; changes between it and --from will NOT be captured",
			zap.String("source", e.leaseName), zap.String("from", cfg.From))
		if err := store.ResetCheckpoint(tctx, e.leaseName); err != nil {
			return err
		}
		*resetPending = false
	}
	var (
		pos    *binlog.Position
		claims []string
	)
	if cfg.ChangeIdentity == "gtid" {
		pos, err = store.LoadCheckpoint(tctx, e.leaseName)
	} else {
		// Digest mode may be chosen below (auto without GTIDs): read the
		// claims in the checkpoint's snapshot now, so the counter can be
		// seeded consistently.
		pos, claims, err = store.LoadCheckpointAndClaims(tctx, e.leaseName, cfg.EffectiveDedupWindow())
	}
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.role = "leader"
	e.signalRoleChange()
	e.mu.Unlock()
	// A standby's buffer that holds every transaction after the
	// checkpoint is enqueued at once and the stream continues where the
	// standby's stopped; otherwise the binlog is read again from the
	// checkpoint.
	var buffered []binlog.Event
	resume := pos
	if ho != nil && pos != nil {
		evs, end, n, ok := ho.after(*pos)
		if ok {
			buffered, resume = evs, &end
			e.log.Info("taking over from the handoff buffer", zap.String("checkpoint", pos.String()),
				zap.Int("transactions", n), zap.Int("events", len(evs)), zap.String("continue_at", end.String()))
		} else {
			e.log.Info("handoff buffer does not reach back to the checkpoint; re-reading the binlog from it",
				zap.String("checkpoint", pos.String()), zap.Int64("dropped_pending", ho.droppedPending()))
		}
		e.reportDropped()
	}
	bcfg := e.streamConfig(resume)
	if pos != nil {
		e.log.Info("resuming from checkpoint", zap.Any("position", pos))
	} else {
		e.log.Info("no checkpoint; starting", zap.String("from", cfg.From))
	}
	stream, err := e.openStream(tctx, bcfg)
	if err != nil {
		return err
	}
	defer stream.Close()
	if pos == nil {
		// Pin --from (now, above all) to the position it resolved to, at
		// once: otherwise a tenure that ends before its first write (a
		// crash, a database restart) starts the next one at a new "now"
		// and the changes in between are never captured (found by
		// e2e.TestFaults).
		start := stream.Position()
		if _, err := store.Enqueue(tctx, cfg.ReplicaID, outbox.FenceOf(l), nil, &outbox.Checkpoint{Source: e.leaseName, Pos: start}); err != nil {
			return fmt.Errorf("write the start position as the checkpoint: %w", err)
		}
		e.log.Info("start position written as the checkpoint", zap.String("position", start.String()))
	}
	info := stream.Info()
	digestMode := false
	switch cfg.ChangeIdentity {
	case "digest":
		digestMode = true
	case "auto":
		digestMode = !info.GTIDMode
	case "gtid":
		if !info.GTIDMode {
			return errors.New("change_identity gtid: the source server does not use GTIDs (enable gtid_mode, or use --change-identity auto|digest)")
		}
	}
	q := &enqueuer{
		store:       store,
		log:         e.log,
		instance:    cfg.Instance,
		claimedBy:   cfg.ReplicaID,
		fence:       outbox.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch},
		source:      e.leaseName,
		routes:      e.routes,
		digestMode:  digestMode,
		batchSize:   cfg.EnqueueBatchSize,
		maxBuffer:   cfg.EnqueueMaxBuffer,
		maxRowBytes: cfg.MaxRowBytes,
		interval:    cfg.EnqueueFlushInterval,
		written:     drains.written,
		valid:       func() bool { return keeper.Lease().Valid(time.Now()) },
		observe:     e.metrics.ObserveEnqueue,
		report:      func(err error) { e.noteWrite(writeEnqueue, err) },
		lastRow:     -1,
		hook:        e.newWatermarkHook(db),
	}
	if digestMode {
		// The counter must remember longer than claims live (see
		// dedup.OccurrenceCounter), hence twice the dedup window.
		q.counter = dedup.NewOccurrenceCounter(2*cfg.EffectiveDedupWindow(), counterMaxEntries)
		q.counter.SeedFromChangeKeys(claims, time.Now())
	}
	e.mu.Lock()
	e.enq, e.stream, e.digest = q, stream, digestMode
	e.lag, e.lastEventAt = 0, time.Now()
	e.metrics.SetSourceConnected(true)
	e.mu.Unlock()
	e.log.Info("enqueueing", zap.Bool("digest_mode", digestMode), zap.Int("routes", len(e.routes)), zap.Int("seeded_claims", len(claims)))

	// The ticker writes batches of an idle stream.
	tickErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(max(cfg.EnqueueFlushInterval/2, 5*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-tctx.Done():
				return
			case <-t.C:
				if err := q.tick(tctx); err != nil {
					if tctx.Err() == nil {
						tickErr <- err
						cancel()
					}
					return
				}
			}
		}
	}()

	handle := func(ctx context.Context, ev binlog.Event) error {
		e.observeEvent(ev)
		return q.handle(ctx, ev)
	}
	for _, ev := range buffered {
		if err = handle(tctx, ev); err != nil {
			break
		}
	}
	buffered = nil
	if err == nil {
		err = stream.Run(tctx, handle)
	}
	select {
	case terr := <-tickErr:
		err = terr
	default:
	}
	lostMu.Lock()
	wasLost := lost
	lostMu.Unlock()
	if ctx.Err() != nil && !wasLost && !errors.Is(err, errLeaseLost) {
		// Graceful stop: write the complete transactions still buffered,
		// fenced by the lease we still hold.
		fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
		ferr := q.final(fctx)
		fcancel()
		if ferr != nil {
			e.log.Warn("write last batch on stop; it is read again from the checkpoint", zap.Error(ferr))
		}
		e.log.Info("enqueue stopped", zap.Int64("rows_written", q.rowsWritten), zap.Int64("batches", q.flushes))
		return nil
	}
	if errors.Is(err, context.Canceled) && wasLost {
		return errLeaseLost
	}
	return err
}

// serverIDBusyFor bounds how long a start waits for a replication
// connection with our server id to go away.
const serverIDBusyFor = 2 * binlog.DefaultReadTimeout

// openStream opens the binlog stream. A server id still registered by a
// connected replica is, for a derived id, almost always this replica's own
// previous process (killed, its dump thread not yet reaped: the server
// notices only when its next heartbeat write fails), so the open is retried
// for a while instead of failing the restart.
func (e *Engine) openStream(ctx context.Context, bcfg binlog.Config) (*binlog.Stream, error) {
	deadline := time.Now().Add(serverIDBusyFor)
	wait := time.Second
	for {
		s, err := binlog.Open(ctx, bcfg)
		// binlog has no sentinel for this check yet; its message is the
		// only signal.
		busy := err != nil && errors.Is(err, binlog.ErrServerNotReady) && strings.Contains(err.Error(), "already used by a connected replica")
		if !busy || time.Now().After(deadline) || ctx.Err() != nil {
			return s, err
		}
		e.log.Warn("server id still in use (a previous process of this replica?); retrying", zap.Uint32("server_id", bcfg.ServerID), zap.Duration("retry_in", wait))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// captureTables is what the binlog reader decodes: --tables, or when that
// is unset and every sink lists the tables it wants, the union of those
// lists (tables nobody subscribes to are then not decoded at all).
func (e *Engine) captureTables() []string {
	if len(e.cfg.Tables) > 0 {
		return e.cfg.Tables
	}
	var union []string
	seen := map[string]bool{}
	for _, s := range e.cfg.Sinks {
		if len(s.Tables.Include) == 0 {
			return nil
		}
		for _, p := range s.Tables.Include {
			if !config.WholeNamePattern(p) {
				return nil // a partial pattern: filter per sink only
			}
			if !seen[p] {
				seen[p] = true
				union = append(union, p)
			}
		}
	}
	return union
}

// serverID is the configured replication client id, or one derived from
// the replica id and instance: stable across restarts, distinct between
// replicas, and well above the small ids servers usually have.
func (e *Engine) serverID() uint32 {
	if e.cfg.ServerID != 0 {
		return e.cfg.ServerID
	}
	h := fnv.New32a()
	h.Write([]byte(e.cfg.Instance + "/" + e.cfg.ReplicaID))
	return 1<<30 | h.Sum32()&(1<<30-1)
}

// Stats are counters of the current tenure, for tests and logs.
type Stats struct {
	RowsWritten int64
	Batches     int64
	// EnqueueTime is the time spent in outbox enqueue transactions.
	EnqueueTime time.Duration
	// Buffered is the rows read but not yet written; Unwritten reports a
	// commit whose checkpoint is not written yet. MaxBuffered is the peak
	// of Buffered (bounded by enqueue_max_buffer plus one change's fan-out).
	Buffered, MaxBuffered int
	Unwritten             bool
}

// Stats returns the current enqueue counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	q := e.enq
	e.mu.Unlock()
	if q == nil {
		return Stats{}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return Stats{
		RowsWritten: q.rowsWritten, Batches: q.flushes, EnqueueTime: q.flushTime,
		Buffered: len(q.ready) + len(q.open), MaxBuffered: q.maxBuffered, Unwritten: q.cp != nil,
	}
}

// refused reports a server's refusal that no retry fixes: access denied
// (1044, 1045) or an unknown database (1049).
func refused(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1044 || me.Number == 1045 || me.Number == 1049)
}

// sameServer reports whether two DSNs name one server address.
func sameServer(a, b string) bool {
	ca, err1 := mysql.ParseDSN(a)
	cb, err2 := mysql.ParseDSN(b)
	return err1 == nil && err2 == nil && ca.Net == cb.Net && ca.Addr == cb.Addr
}

// transient reports whether err is the database going away (restart,
// network) rather than something a retry cannot fix.
func transient(err error) bool {
	if errors.Is(err, binlog.ErrPositionUnavailable) {
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) {
		return true
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1053, 1077, 1927, 2002, 2003, 2006, 2013: // shutdown in progress, normal shutdown, connection killed, connection lost
			return true
		}
	}
	msg := err.Error()
	for _, m := range []string{"connection refused", "invalid connection", "bad connection", "broken pipe", "connection reset", "server shutdown", "EOF"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// endpointer is a sink that reports its endpoint's adaptive concurrency.
type endpointer interface {
	Endpoint() sink.LimiterStats
}

// endpointStats lists the adaptive concurrency state of the sinks that
// pace themselves.
func (e *Engine) endpointStats() []metrics.EndpointStat {
	var out []metrics.EndpointStat
	for name, se := range e.sinks {
		if ep, ok := se.sink.(endpointer); ok {
			out = append(out, metrics.EndpointStat{Sink: name, LimiterStats: ep.Endpoint()})
		}
	}
	return out
}

// endpoints is endpointStats for /v1/sinks.
func (e *Engine) endpoints() map[string]inspect.EndpointStatus {
	out := map[string]inspect.EndpointStatus{}
	for name, se := range e.sinks {
		ep, ok := se.sink.(endpointer)
		if !ok {
			continue
		}
		st := ep.Endpoint()
		rtt, floor := st.Millis()
		out[name] = inspect.EndpointStatus{Limit: st.Limit, Max: st.Max, InFlight: st.InFlight, RTTMs: rtt, FloorMs: floor,
			PausedFor: st.PausedFor.Seconds(), Overloads: st.Overloads}
	}
	return out
}
