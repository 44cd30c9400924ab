package engine

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/internal/pause"
)

// The fleet's backfills: snapshot: initial, the signal table and POST
// /v1/backfills start backfills that the enqueue lease holder runs (owner
// backfill.OwnerFleet). Their runners live as long as the tenure: a new
// leader — after a failover, a restart, a SIGKILL — finds them still
// running in the backfills table and resumes each from its completed
// prefix, as cdcout backfill --resume does.

const (
	// fleetBackfillEvery is how often the leader looks for signals and
	// for fleet backfills without a runner.
	fleetBackfillEvery = time.Second
	// maxFleetBackfills run at once; the others wait their turn.
	maxFleetBackfills = 4
)

// fleetBackfills is one tenure's runner of the fleet's backfills.
type fleetBackfills struct {
	e      *Engine
	state  *sql.DB
	source *sql.DB
	log    *zap.Logger

	mu      sync.Mutex
	running map[string]bool
	wg      sync.WaitGroup
	// snapshotted: the snapshot: initial check has run in this tenure
	// (the configuration cannot change within one).
	snapshotted bool
	// failing: the steps whose last round failed; a step is logged at
	// warn when it starts failing, not every second while it does.
	failMu  sync.Mutex
	failing map[string]bool
}

// runFleetBackfills runs the fleet's backfills until ctx (the tenure's)
// ends, and waits for their runners.
func (e *Engine) runFleetBackfills(ctx context.Context, state *sql.DB) {
	source, err := openSource(e.cfg.DSN.Value())
	if err != nil {
		e.log.Error("backfills: open the source", zap.Error(err))
		return
	}
	defer source.Close()
	fb := &fleetBackfills{e: e, state: state, source: source, log: e.log.Named("backfills"), running: map[string]bool{}, failing: map[string]bool{}}
	defer fb.wg.Wait()
	for {
		fb.round(ctx)
		if pause.For(ctx, fleetBackfillEvery) != nil {
			return
		}
	}
}

// openSource is a small pool on the source for backfill runners.
func openSource(dsn string) (*sql.DB, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2 * maxFleetBackfills)
	return db, nil
}

func (fb *fleetBackfills) round(ctx context.Context) {
	if !fb.snapshotted {
		err := fb.snapshots(ctx)
		fb.note(ctx, "snapshot: initial: look for tables new to their sinks; retrying every second", err)
		fb.snapshotted = err == nil
	}
	fb.note(ctx, "read backfill signals; retrying every second", fb.signals(ctx))
	fb.note(ctx, "look for fleet backfills to run; retrying every second", fb.resume(ctx))
}

// note logs a step's failure when it starts (a state database that went
// away would otherwise add three lines a second) and its recovery.
func (fb *fleetBackfills) note(ctx context.Context, step string, err error) {
	fb.failMu.Lock()
	defer fb.failMu.Unlock()
	switch {
	case ctx.Err() != nil:
	case err != nil && !fb.failing[step]:
		fb.failing[step] = true
		fb.log.Warn(step, zap.Error(err))
	case err == nil && fb.failing[step]:
		delete(fb.failing, step)
		fb.log.Info("backfills: working again", zap.String("step", step))
	}
}

// subscription is what a sink takes, as sink_subscriptions records it.
type subscription struct {
	Tables  config.TableFilter `json:"tables"`
	Capture []string           `json:"capture,omitempty"`
	Ops     []string           `json:"ops,omitempty"`
}

func (e *Engine) subscriptionOf(s config.Sink) subscription {
	return subscription{Tables: s.Tables, Capture: e.cfg.Tables, Ops: s.Ops}
}

// takes reports whether the subscription gets backfilled rows of
// db.table: the capture list, the sink's tables, and its ops (a backfilled
// row is an insert to it).
func (s subscription) takes(db, table string) bool {
	if len(s.Capture) > 0 && !(config.TableFilter{Include: s.Capture}).Matches(db, table) {
		return false
	}
	if len(s.Ops) > 0 && !slices.Contains(s.Ops, "insert") {
		return false
	}
	return s.Tables.Matches(db, table)
}

// takes reports whether sink gets backfilled rows of db.table.
func (e *Engine) takes(sink, db, table string) bool {
	for _, s := range e.cfg.Sinks {
		if s.Name == sink {
			return e.subscriptionOf(s).takes(db, table)
		}
	}
	return false
}

// snapshots records each sink's subscription and, for a sink with
// snapshot: initial, starts a backfill of every table new to it (see
// backfill.SinkSubscription for what "new" means).
func (fb *fleetBackfills) snapshots(ctx context.Context) error {
	cfg := fb.e.cfg
	var tables []string
	for _, s := range cfg.Sinks {
		sub := fb.e.subscriptionOf(s)
		raw, _ := json.Marshal(sub)
		oldRaw, known, err := backfill.SinkSubscription(ctx, fb.state, cfg.StateDB, cfg.Instance, s.Name)
		if err != nil {
			return err
		}
		if s.Snapshot == config.SnapshotInitial && oldRaw != string(raw) {
			var old *subscription
			if known {
				old = &subscription{}
				if err := json.Unmarshal([]byte(oldRaw), old); err != nil {
					return fmt.Errorf("sink %s: recorded subscription %q: %w", s.Name, oldRaw, err)
				}
			}
			if tables == nil {
				if tables, err = backfill.SourceTables(ctx, fb.source, cfg.StateDB); err != nil {
					return err
				}
			}
			if err := fb.snapshotSink(ctx, s.Name, sub, old, tables); err != nil {
				return err
			}
		}
		if err := backfill.RecordSinkSubscription(ctx, fb.state, cfg.StateDB, cfg.Instance, s.Name, string(raw)); err != nil {
			return err
		}
	}
	return nil
}

// snapshotSink starts a backfill of each table sub takes and old (nil: a
// sink never seen) did not.
func (fb *fleetBackfills) snapshotSink(ctx context.Context, sink string, sub subscription, old *subscription, tables []string) error {
	cfg := fb.e.cfg
	started, err := backfill.SinkTables(ctx, fb.state, cfg.StateDB, cfg.Instance, sink)
	if err != nil {
		return err
	}
	for _, tbl := range tables {
		db, name, _ := strings.Cut(tbl, ".")
		if started[tbl] || !sub.takes(db, name) || old != nil && old.takes(db, name) {
			continue
		}
		id := ""
		info, err := fb.start(ctx, backfill.Spec{Table: tbl, Sinks: []string{sink}, ChunkSize: cfg.BackfillChunkSize, Instance: cfg.Instance,
			Owner: backfill.OwnerFleet, Origin: "snapshot"}, true)
		switch {
		case backfill.IsBadInput(err):
			// A table no backfill can read (no key): say so once.
			fb.log.Error("snapshot: initial cannot backfill this table; its rows reach the sink only as they change",
				zap.String("sink", sink), zap.String("table", tbl), zap.Error(err))
		case err != nil:
			return err
		default:
			id = info.ID
			fb.log.Info("snapshot: initial: backfilling a table new to its sink", zap.String("sink", sink), zap.String("table", tbl),
				zap.String("backfill", id), zap.Bool("read_only", info.ReadOnly))
		}
		if err := backfill.RecordSinkTable(ctx, fb.state, cfg.StateDB, cfg.Instance, sink, tbl, id); err != nil {
			return err
		}
	}
	return nil
}

// start prepares a fleet backfill (creating its row, or finding the
// unfinished one with the same selection). fallback: when the source
// refuses the watermark table, the backfill is read-only.
func (fb *fleetBackfills) start(ctx context.Context, spec backfill.Spec, fallback bool) (backfill.Info, error) {
	r := &backfill.Runner{Source: fb.source, State: fb.state, StateSchema: fb.e.cfg.StateDB, Logger: fb.log}
	info, err := r.Prepare(ctx, spec)
	if fallback && !spec.ReadOnly && errors.Is(err, backfill.ErrWatermarkDenied) {
		fb.log.Info("the source refuses watermark writes; backfilling read-only", zap.String("table", spec.Table), zap.Error(err))
		spec.ReadOnly = true
		r = &backfill.Runner{Source: fb.source, State: fb.state, StateSchema: fb.e.cfg.StateDB, Logger: fb.log}
		info, err = r.Prepare(ctx, spec)
	}
	return info, err
}

// signals starts the backfills pending signals ask for; a signal that
// cannot start gets its reason.
func (fb *fleetBackfills) signals(ctx context.Context) error {
	cfg := fb.e.cfg
	list, err := backfill.PendingSignals(ctx, fb.state, cfg.StateDB, cfg.Instance)
	if err != nil {
		return err
	}
	for _, g := range list {
		spec, err := fb.e.BackfillSpec(g)
		var info backfill.Info
		if err == nil {
			info, err = fb.start(ctx, spec, false)
		}
		if err != nil {
			if ctx.Err() != nil || transient(err) && !backfill.IsBadInput(err) {
				return err // the database went away: the signal waits for the next round
			}
			if errors.Is(err, backfill.ErrWatermarkDenied) {
				err = fmt.Errorf("%w (set read_only = 1 on the signal to backfill without writing to the source)", err)
			}
			fb.log.Warn("backfill signal refused", zap.Int64("signal", g.ID), zap.String("table", g.Table), zap.Error(err))
			if err := backfill.SignalRefused(ctx, fb.state, cfg.StateDB, g.ID, fb.e.scrubbed(err)); err != nil {
				return err
			}
			continue
		}
		switch err := backfill.SignalStarted(ctx, fb.state, cfg.StateDB, g.ID, info.ID); {
		case errors.Is(err, backfill.ErrSignalNotLinked):
			// The backfill Prepare resumed ended just now: the signal stays
			// pending and the next round starts a backfill of its own.
			fb.log.Info("the backfill a signal was to continue ended meanwhile; the signal waits for the next round",
				zap.Int64("signal", g.ID), zap.String("backfill", info.ID))
			continue
		case err != nil:
			return err
		}
		fb.log.Info("backfill signal started a backfill", zap.Int64("signal", g.ID), zap.String("table", g.Table), zap.String("backfill", info.ID))
	}
	return nil
}

// scrubbed is err with the configuration's secrets removed.
func (e *Engine) scrubbed(err error) error {
	msg := err.Error()
	for _, s := range e.secrets() {
		msg = strings.ReplaceAll(msg, s, "[redacted]")
	}
	return errors.New(msg)
}

// BackfillSpec checks a requested backfill against the configuration —
// the table's form, the sinks (configured, subscribed to the table;
// default every subscribed one), the chunk size, the WHERE's form — and
// returns the fleet backfill's spec. Errors wrap backfill.ErrBadInput.
func (e *Engine) BackfillSpec(g backfill.Signal) (backfill.Spec, error) {
	bad := func(format string, args ...any) (backfill.Spec, error) {
		return backfill.Spec{}, fmt.Errorf("%w: %s", backfill.ErrBadInput, fmt.Sprintf(format, args...))
	}
	db, name, ok := strings.Cut(g.Table, ".")
	if !ok || db == "" || name == "" || strings.Contains(name, ".") {
		return bad("table %q: want db.table", g.Table)
	}
	var configured, subscribed []string
	for _, s := range e.cfg.Sinks {
		configured = append(configured, s.Name)
		if e.takes(s.Name, db, name) {
			subscribed = append(subscribed, s.Name)
		}
	}
	sinks := g.Sinks
	if len(sinks) == 0 {
		if len(subscribed) == 0 {
			return bad("no sink subscribes to %s (sinks: %s)", g.Table, strings.Join(configured, ", "))
		}
		sinks = subscribed
	}
	for _, s := range sinks {
		if !slices.Contains(configured, s) {
			return bad("sink %q: no such sink (configured: %s)", s, strings.Join(configured, ", "))
		}
		if !slices.Contains(subscribed, s) {
			return bad("sink %q does not subscribe to %s (its tables, ops or the capture list leave it out)", s, g.Table)
		}
	}
	if g.ChunkSize < 0 || g.ChunkSize > backfill.MaxChunkSize {
		return bad("chunk_size %d: between 1 and %d, or 0 for %d", g.ChunkSize, backfill.MaxChunkSize, backfill.DefaultChunkSize)
	}
	if g.Where != "" {
		if err := backfill.CheckWhere(g.Where); err != nil {
			return bad("where %q: %v", g.Where, err)
		}
	}
	chunk := g.ChunkSize
	if chunk == 0 {
		chunk = e.cfg.BackfillChunkSize
	}
	return backfill.Spec{Table: g.Table, Sinks: sinks, Where: g.Where, ChunkSize: chunk, Instance: e.cfg.Instance,
		ReadOnly: g.ReadOnly, Owner: backfill.OwnerFleet, Origin: fmt.Sprintf("signal:%d", g.ID)}, nil
}

// requestBackfill serves POST /v1/backfills: it checks the request as the
// leader will (configuration, then the table and WHERE on the source) and
// writes the signal the leader picks up.
func (e *Engine) requestBackfill(state *sql.DB) func(context.Context, backfill.Signal) (backfill.Signal, error) {
	return func(ctx context.Context, g backfill.Signal) (backfill.Signal, error) {
		spec, err := e.BackfillSpec(g)
		if err != nil {
			return g, err
		}
		src, err := openSource(e.cfg.DSN.Value())
		if err != nil {
			return g, e.scrubbed(err)
		}
		defer src.Close()
		if err := backfill.Check(ctx, src, spec); err != nil {
			if backfill.IsBadInput(err) {
				return g, err
			}
			return g, e.scrubbed(err)
		}
		g.Sinks = spec.Sinks
		if g.ID, err = backfill.InsertSignal(ctx, state, e.cfg.StateDB, g); err != nil {
			return g, e.scrubbed(err)
		}
		g.Status = backfill.SignalPending
		g.CreatedAt = time.Now().UTC()
		g.UpdatedAt = g.CreatedAt
		return g, nil
	}
}

// resume starts a runner for every fleet backfill without one, up to
// maxFleetBackfills at a time.
func (fb *fleetBackfills) resume(ctx context.Context) error {
	cfg := fb.e.cfg
	list, err := backfill.FleetRunning(ctx, fb.state, cfg.StateDB, cfg.Instance)
	if err != nil {
		return err
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	for _, info := range list {
		if fb.running[info.ID] || len(fb.running) >= maxFleetBackfills {
			continue
		}
		fb.running[info.ID] = true
		fb.wg.Add(1)
		go func(id string) {
			defer fb.wg.Done()
			fb.runOne(ctx, id)
			fb.mu.Lock()
			delete(fb.running, id)
			fb.mu.Unlock()
		}(info.ID)
	}
	return nil
}

// runOne runs fleet backfill id until it ends or the tenure does, and
// writes a finished backfill's outcome to its signals.
func (fb *fleetBackfills) runOne(ctx context.Context, id string) {
	cfg := fb.e.cfg
	log := fb.log.With(zap.String("backfill", id))
	r := &backfill.Runner{Source: fb.source, State: fb.state, StateSchema: cfg.StateDB, Logger: log, Retryable: transient}
	info, err := r.Prepare(ctx, backfill.Spec{ResumeID: id, Instance: cfg.Instance})
	if err == nil {
		fb.note(ctx, "fleet backfill "+id+" interrupted by a database error; resuming", nil)
		log.Info("running fleet backfill", zap.String("table", info.Table), zap.Strings("sinks", info.Sinks), zap.Int64("rows_done", info.RowsDone),
			zap.Bool("read_only", info.ReadOnly), zap.String("origin", info.Origin))
		err = r.Run(ctx)
	}
	if ctx.Err() != nil {
		return // the next leader resumes it
	}
	if err != nil && !errors.Is(err, backfill.ErrCancelled) {
		if transient(err) && !backfill.IsBadInput(err) {
			// Resumed next second, as long as the database is away: say so
			// once.
			fb.note(ctx, "fleet backfill "+id+" interrupted by a database error; resuming", err)
			return
		}
		log.Error("fleet backfill failed", zap.Error(err))
		if backfill.IsBadInput(err) {
			// Prepare refused the stored spec (the table lost its key, …):
			// the backfill is failed, not retried every second.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = backfill.Fail(fctx, fb.state, cfg.StateDB, id, fb.e.scrubbed(err).Error())
			cancel()
		}
	}
	final, gerr := backfill.Get(ctx, fb.state, cfg.StateDB, id)
	if gerr != nil {
		log.Warn("read the finished backfill", zap.Error(gerr))
		return
	}
	if final.Status == backfill.StatusRunning {
		return
	}
	log.Info("fleet backfill ended", zap.String("status", final.Status), zap.Int64("rows", final.RowsDone))
}
