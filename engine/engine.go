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
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/control"
	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/internal/pause"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/metrics"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/replay"
	"github.com/cdcout/cdcout/state"
)

// counterMaxEntries bounds the digest-mode occurrence counter (about 150
// bytes an entry).
const counterMaxEntries = 200_000

// Option adjusts an Engine.
type Option func(*Engine)

// WithStdout sets where stdout: sinks write (default os.Stdout).
func WithStdout(w io.Writer) Option { return func(e *Engine) { e.stdout = w } }

// WithoutFleetBackfills keeps the engine from running the fleet's
// backfills (snapshot: initial, signals) while it leads: cdcout backfill's
// own engine, whose configuration is not the fleet's, must neither record
// its sinks' subscriptions nor start snapshots for them.
func WithoutFleetBackfills() Option { return func(e *Engine) { e.noFleetBackfills = true } }

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
	runway     runwayState // runway.go
	// segFmt is the segment format the store writes and why (segformat.go).
	segFmt    int
	segFmtWhy string
	rowCols   []sinkRowColumns // msgkey.go
	hb        heartbeats       // heartbeat.go
	// noFleetBackfills: see WithoutFleetBackfills.
	noFleetBackfills bool
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
		role:      inspect.RoleStandby,
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
		key, tmpl, err := rowColumns(sc)
		if err != nil {
			e.closeSinks()
			return nil, fmt.Errorf("sinks[%d] (%s).url: %w", i, sc.Name, err)
		}
		e.rowCols = append(e.rowCols, sinkRowColumns{name: sc.Name, tables: sc.Tables, key: key, tmpl: tmpl})
		e.sinks[sc.Name] = sinkEntry{cfg: sc, sink: withMessageKey(sc, s)}
		r, err := newRoute(sc)
		if err != nil {
			e.closeSinks()
			return nil, fmt.Errorf("sinks[%d].filter: %w", i, err)
		}
		r.countFiltered = e.metrics.ObserveFiltered
		e.routes = append(e.routes, r)
	}
	e.metrics.WatchEndpoints(e.endpointStats)
	return e, nil
}

// Holder is this process's lease holder and drain claim id.
func (e *Engine) Holder() string { return e.holder }

// Run runs the replica until ctx ends (returning nil after a graceful stop)
// or a fatal error.
func (e *Engine) Run(parent context.Context) error {
	defer e.closeSinks()
	// ctx also ends when the inspect server cannot serve (address in use):
	// the replica then stops as gracefully as on a signal and reports why.
	ctx, stopRun := context.WithCancel(parent)
	defer stopRun()
	if err := e.preflight(ctx); err != nil {
		return err
	}
	if err := e.checkRowColumns(ctx); err != nil {
		return err
	}
	pool, err := e.openState(ctx)
	if pool == nil {
		return err // nil when ctx ended first
	}
	defer pool.Close()
	db := pool.DB
	var services group
	defer services.stop()
	serveErr := make(chan error, 1)
	e.startInspect(ctx, &services, db, func(err error) { serveErr <- err; stopRun() })
	leases := lease.NewManager(db, e.cfg.StateDB)
	drains, err := e.startDelivery(ctx, &services, db, leases)
	if err != nil {
		return err
	}
	fixedFormat := segmentFormat(e.cfg.SegmentFormat) // 0: auto
	store := outbox.NewStore(db, e.cfg.StateDB, e.log).WithSegmentFormat(fixedFormat).WithReadCommitted(pool.ReadCommitted()).WithRecent(drains.recent)
	if fixedFormat == 0 {
		services.run(ctx, func(c context.Context) { e.watchSegmentFormat(c, db, store) }, nil) // segformat.go
	} else {
		e.setSegFormat(fixedFormat, "segment_format "+e.cfg.SegmentFormat)
	}
	services.run(ctx, func(c context.Context) { e.watchRunway(c, store) }, nil) // runway.go
	services.run(ctx, e.runHeartbeats, nil)                                     // heartbeat.go
	runErr := e.lead(ctx, &leader{e: e, db: db, leases: leases, store: store,
		drains: drains, resetPending: e.cfg.ResetPosition})
	e.stopDrainers(drains)
	select {
	case err := <-serveErr:
		if runErr == nil {
			runErr = err
		}
	default:
	}
	return runErr
}

// preflight refuses a source whose binary log cdcout can never read
// before the state database is created or migrated (by default it lives on
// that same server). A source that does not answer yet is only logged: the
// stream retries it.
func (e *Engine) preflight(ctx context.Context) error {
	cfg := e.cfg
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	err := binlog.Preflight(pctx, cfg.DSN.Value())
	pcancel()
	switch {
	case err == nil || ctx.Err() != nil:
	case errors.Is(err, binlog.ErrServerNotReady) || state.Refused(err):
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
	return nil
}

// openState opens, checks and migrates the state database. It returns a
// nil db and a nil error when ctx ended meanwhile.
func (e *Engine) openState(ctx context.Context) (*state.Pool, error) {
	cfg := e.cfg
	db, err := openDB(cfg.EffectiveStateDSN().Value(), cfg.LeaseTTL)
	if err != nil {
		return nil, fmt.Errorf("state database %s: %w", config.DSNAddr(cfg.EffectiveStateDSN().Value()), err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, fmt.Errorf("connect to state database %s: %w", config.DSNAddr(cfg.EffectiveStateDSN().Value()), err)
	}
	if err := state.Migrate(ctx, db.DB, cfg.StateDB); err != nil {
		db.Close()
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, err
	}
	return db, nil
}

// startInspect starts the inspect server. It outlives the rest of the stop
// sequence (it is the first service), so /readyz and metrics answer until
// the end; failed is told when it cannot serve.
func (e *Engine) startInspect(ctx context.Context, services *group, db *sql.DB, failed func(error)) {
	cfg := e.cfg
	srv := inspect.New(inspect.Config{Addr: cfg.HTTPAddr, KeepAlive: cfg.HTTPKeepAlive, HeadersTimeout: cfg.HTTPHeadersTimeout, RunwayMin: cfg.BinlogRunwayMin,
		Admin: inspect.AdminConfig{Token: cfg.AdminTokenValue(), Addr: cfg.AdminAddr, ReadAuth: cfg.AdminReadAuth}}, inspect.Deps{
		DB: db, Schema: cfg.StateDB, Instance: cfg.Instance, ReplicaID: cfg.ReplicaID,
		Source: e.sourceStatus, Ready: e.ready, Metrics: e.metrics, Pipes: nil,
		DroppedPending: e.droppedPending, Endpoints: e.endpoints, Sinks: e.sinkNames(),
		Secrets: e.secrets(), Logger: e.log, RequestBackfill: e.requestBackfill(db),
	})
	services.run(context.WithoutCancel(ctx), func(ictx context.Context) {
		if err := srv.Run(ictx); err != nil && ictx.Err() == nil {
			failed(err)
		}
	}, nil)
}

// startDelivery starts what delivers and keeps the state tidy: the
// drainers with their drain leases, the fleet heartbeat and the janitor.
// Drainers run for the whole Run, across enqueue tenures: delivery does
// not depend on who enqueues.
func (e *Engine) startDelivery(ctx context.Context, services *group, db *sql.DB, leases *lease.Manager) (*drainers, error) {
	cfg := e.cfg
	dctx, stopDrain := context.WithCancel(context.WithoutCancel(ctx))
	services.onStop(stopDrain)
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
		return nil, err
	}
	// Stopping only ends the reads; the last state read stays in force
	// for the drainers that are still finishing.
	services.onStop(paused.Stop)
	drains.leases = pauseGate(paused, dl.get)
	rp := &replayer{db: db, store: outbox.NewStore(db, cfg.StateDB, e.log), schema: cfg.StateDB, instance: cfg.Instance, holder: e.holder,
		sinks: e.sinks, paused: paused, held: dl.get, known: dl.addPipes, log: e.log.Named("replay"), retryMin: 200 * time.Millisecond, retryMx: 5 * time.Second,
		running: map[string]bool{}, routes: e.routes, maxRowBytes: cfg.MaxRowBytes,
		stream: func() binlog.Config { return e.streamConfig(nil) }}
	services.run(ctx, rp.run, nil) // replay.go
	drains.notify = dl.addPipes
	e.mu.Lock()
	e.dl = dl
	e.mu.Unlock()
	services.run(context.WithoutCancel(ctx), dl.run, func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		dl.releaseAll(rctx)
		rcancel()
	})
	if err := drains.discover(ctx); err != nil && ctx.Err() == nil {
		e.log.Warn("look up pipes with pending rows", zap.Error(err))
	}

	// The fleet observation: who this replica is and what it holds.
	hb := &fleet.Heartbeat{DB: db, Schema: cfg.StateDB, Every: heartbeatEvery(cfg.LeaseTTL), Observe: e.observation, Logger: e.log, Changed: e.roleChanged,
		Final: e.stoppedObservation}
	services.run(ctx, func(hctx context.Context) { _ = hb.Run(hctx) }, nil)
	// Drainers stop claiming as soon as the stop is asked for.
	stopWatch := context.AfterFunc(ctx, drains.stopClaiming)
	services.onStop(func() { stopWatch() })

	janitor, err := outbox.NewJanitor(outbox.JanitorConfig{
		DB:          db,
		Schema:      cfg.StateDB,
		Retention:   time.Duration(cfg.RetentionHours) * time.Hour,
		DedupWindow: cfg.EffectiveDedupWindow(),
		Hold:        func(ctx context.Context) (map[string]bool, error) { return replay.HeldPipes(ctx, db, cfg.StateDB) },
		Logger:      e.log,
	})
	if err != nil {
		return nil, err
	}
	services.run(ctx, func(jctx context.Context) {
		if err := janitor.Run(jctx); err != nil && jctx.Err() == nil {
			e.log.Error("janitor stopped", zap.Error(err))
		}
	}, nil)
	return drains, nil
}

// lead takes the enqueue lease and runs tenures until ctx ends or an error
// no retry fixes.
func (e *Engine) lead(ctx context.Context, ld *leader) error {
	for ctx.Err() == nil {
		l, ho, err := e.acquire(ctx, ld.leases, ld.store)
		if err != nil {
			if ctx.Err() == nil {
				return err
			}
			return nil
		}
		err = ld.tenure(ctx, l, ho)
		switch {
		case errors.Is(err, errLeaseLost):
			e.log.Warn("enqueue lease lost; stopped enqueueing, following as a standby", zap.Error(err))
			continue
		case errors.Is(err, errReread):
			e.log.Info("re-reading from the checkpoint", zap.Error(err))
			continue
		case err != nil && ctx.Err() == nil && transient(err):
			// The database went away (restart, network): the lease is
			// released or lapses, and any replica (this one too) resumes
			// from the checkpoint once it is back.
			e.log.Warn("enqueue stopped by a database error; retrying", zap.Error(err))
			_ = pause.For(ctx, time.Second) // a stop ends the loop
			continue
		case err != nil && ctx.Err() == nil:
			return err
		}
		return nil
	}
	return nil
}

// stopDrainers stops the drainers' claims, waits for the deliveries in
// flight (at most the shutdown timeout) and then releases what was claimed
// and never sent.
func (e *Engine) stopDrainers(drains *drainers) {
	drains.stopClaiming()
	if !drains.wait(e.cfg.ShutdownTimeout) {
		e.log.Warn("deliveries still in flight after the shutdown timeout; their rows are redelivered after the claim lease",
			zap.Duration("shutdown_timeout", e.cfg.ShutdownTimeout))
		return
	}
	e.log.Info("drainers stopped", zap.Int64("segments_from_memory", drains.recent.Hits()))
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if n, err := drains.releaseOrphans(rctx); err != nil {
		e.log.Warn("release claims", zap.Error(err))
	} else if n > 0 {
		e.log.Info("released claimed rows that were never delivered", zap.Int64("rows", n))
	}
}

// openDB opens the state database through state.Open: UTC sessions,
// MINIMAL row images where the user may set them, and a server-side idle
// limit of one lease TTL, so a replica frozen inside a transaction loses
// its locks about when it loses its lease instead of blocking the takeover.
func openDB(dsn string, leaseTTL time.Duration) (*state.Pool, error) {
	p, err := state.Open(dsn, leaseTTL)
	if err != nil {
		return nil, err
	}
	p.SetMaxOpenConns(32)
	p.SetMaxIdleConns(32)
	return p, nil
}

// sameServer reports whether two DSNs name one server address.
func sameServer(a, b string) bool {
	ca, err1 := mysql.ParseDSN(a)
	cb, err2 := mysql.ParseDSN(b)
	return err1 == nil && err2 == nil && ca.Net == cb.Net && ca.Addr == cb.Addr
}

// transient reports whether err is the database going away (restart,
// network) rather than something a retry cannot fix. A purged checkpoint
// position is never transient, however the server said it.
func transient(err error) bool {
	return !errors.Is(err, binlog.ErrPositionUnavailable) && state.ConnectionLost(err)
}
