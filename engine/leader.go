package engine

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/dedup"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/internal/buildinfo"
	"github.com/cdcout/cdcout/internal/pause"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/outbox"
)

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
		if err := pause.For(ctx, acquireEvery(ttl)); err != nil {
			return lease.Lease{}, nil, err
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

// handoffWindow is the handoff buffer's age bound: the dedup window, so a
// buffered change is never older than the claims that collapse it.
func (e *Engine) handoffWindow() time.Duration { return e.cfg.EffectiveDedupWindow() }

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
		DDLRecords:   slices.ContainsFunc(cfg.Sinks, func(s config.Sink) bool { return s.DDL }),
	}
}

// leader holds what the enqueue tenures of one Run share.
type leader struct {
	e      *Engine
	db     *sql.DB
	leases *lease.Manager
	store  *outbox.Store
	drains *drainers
	// resetPending is --reset-position until a tenure has discarded the
	// checkpoint: once per Run, not on every takeover.
	resetPending bool
}

// tenure is one term as the enqueue lease holder: read from the checkpoint
// and enqueue until the Run's context ends or the lease is lost.
type tenure struct {
	*leader
	lease  lease.Lease
	ho     *handoff // the standby phase's buffer, nil when there was none
	keeper *lease.Keeper
	// ctx ends with the term: the Run's stop, the lease lost, a failed
	// tick; cancel ends it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the keeper and the ticker
}

// tenure runs one term under l, taking over from ho.
func (ld *leader) tenure(ctx context.Context, l lease.Lease, ho *handoff) (err error) {
	e := ld.e
	t := &tenure{leader: ld, lease: l, ho: ho}
	t.ctx, t.cancel = context.WithCancel(ctx)
	defer t.cancel()
	t.keeper = ld.leases.NewKeeper(l, e.log)
	t.keeper.OnRenew = func(err error) { e.noteWrite(writeRenewal, err) }
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		if err := t.keeper.Run(t.ctx); errors.Is(err, lease.ErrNotHeld) {
			t.cancel()
		}
	}()
	defer func() { err = t.end(err) }()

	pos, claims, err := t.begin()
	if err != nil {
		return err
	}
	stream, buffered, err := t.openStream(pos)
	if err != nil {
		return err
	}
	defer stream.Close()
	q, err := t.enqueuer(stream, claims)
	if err != nil {
		return err
	}
	// The fleet's backfills run while this replica leads (backfills.go).
	if !e.noFleetBackfills {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			e.runFleetBackfills(t.ctx, t.db)
		}()
	}
	return t.enqueue(ctx, q, stream, buffered)
}

// lost reports whether the keeper lost the lease.
func (t *tenure) lost() bool {
	select {
	case <-t.keeper.Lost():
		return true
	default:
		return false
	}
}

// end stops the term's goroutines, steps down to standby and releases the
// lease unless it was lost; a term that ended because the lease was lost
// returns errLeaseLost.
func (t *tenure) end(err error) error {
	e := t.e
	t.cancel()
	t.wg.Wait()
	e.metrics.SetLeaseHeld(t.lease.Name, false)
	e.mu.Lock()
	e.stream, e.role = nil, inspect.RoleStandby
	e.metrics.SetSourceConnected(false)
	e.signalRoleChange()
	e.mu.Unlock()
	lost := t.lost()
	if lost && err == nil || lost && errors.Is(err, context.Canceled) {
		err = fmt.Errorf("%w: %v", errLeaseLost, t.keeper.Err())
	}
	if !lost && !errors.Is(err, errLeaseLost) {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		if rerr := t.leases.Release(rctx, t.keeper.Lease()); rerr != nil && !errors.Is(rerr, lease.ErrNotHeld) {
			e.log.Warn("release enqueue lease", zap.Error(rerr))
		}
		rcancel()
	}
	return err
}

// begin makes this replica the leader: ids after the previous leader's,
// --reset-position once, and the checkpoint (with, in digest mode, the
// claims read in its snapshot).
func (t *tenure) begin() (*binlog.Position, []string, error) {
	e, cfg := t.e, t.e.cfg
	// A new leader's ids must sort after the previous leader's.
	if err := t.store.RaiseIDFloor(t.ctx); err != nil {
		return nil, nil, err
	}
	if t.resetPending {
		e.log.Warn("--reset-position: DISCARDING the stored checkpoint; changes between it and --from will NOT be captured",
			zap.String("source", e.leaseName), zap.String("from", cfg.From))
		if err := t.store.ResetCheckpoint(t.ctx, e.leaseName); err != nil {
			return nil, nil, err
		}
		t.resetPending = false
	}
	var (
		pos    *binlog.Position
		claims []string
		err    error
	)
	if cfg.ChangeIdentity == "gtid" {
		pos, err = t.store.LoadCheckpoint(t.ctx, e.leaseName)
	} else {
		// Digest mode may be chosen below (auto without GTIDs): read the
		// claims in the checkpoint's snapshot now, so the counter can be
		// seeded consistently.
		pos, claims, err = t.store.LoadCheckpointAndClaims(t.ctx, e.leaseName, cfg.EffectiveDedupWindow())
	}
	if err != nil {
		return nil, nil, err
	}
	e.mu.Lock()
	e.role = inspect.RoleLeader
	e.signalRoleChange()
	e.mu.Unlock()
	return pos, claims, nil
}

// openStream opens the term's binlog stream. A standby's buffer that holds
// every transaction after the checkpoint pos is enqueued at once (the
// returned events) and the stream continues where the standby's stopped;
// otherwise the binlog is read again from the checkpoint. Without a
// checkpoint the position --from resolved to is written as one at once.
func (t *tenure) openStream(pos *binlog.Position) (*binlog.Stream, []binlog.Event, error) {
	e, cfg := t.e, t.e.cfg
	var buffered []binlog.Event
	resume := pos
	if t.ho != nil && pos != nil {
		evs, end, n, ok := t.ho.after(*pos)
		if ok {
			buffered, resume = evs, &end
			e.log.Info("taking over from the handoff buffer", zap.String("checkpoint", pos.String()),
				zap.Int("transactions", n), zap.Int("events", len(evs)), zap.String("continue_at", end.String()))
		} else {
			e.log.Info("handoff buffer does not reach back to the checkpoint; re-reading the binlog from it",
				zap.String("checkpoint", pos.String()), zap.Int64("dropped_pending", t.ho.droppedPending()))
		}
		e.reportDropped()
	}
	bcfg := e.streamConfig(resume)
	if pos != nil {
		e.log.Info("resuming from checkpoint", zap.Any("position", pos))
	} else {
		e.log.Info("no checkpoint; starting", zap.String("from", cfg.From))
	}
	stream, err := e.openStream(t.ctx, bcfg)
	if err != nil {
		return nil, nil, err
	}
	if pos == nil {
		// Pin --from (now, above all) to the position it resolved to, at
		// once: otherwise a tenure that ends before its first write (a
		// crash, a database restart) starts the next one at a new "now"
		// and the changes in between are never captured (found by
		// e2e.TestFaults).
		start := stream.Position()
		if _, err := t.store.Enqueue(t.ctx, cfg.ReplicaID, outbox.FenceOf(t.lease), nil, &outbox.Checkpoint{Source: e.leaseName, Pos: start}); err != nil {
			stream.Close()
			return nil, nil, fmt.Errorf("write the start position as the checkpoint: %w", err)
		}
		e.log.Info("start position written as the checkpoint", zap.String("position", start.String()))
	}
	return stream, buffered, nil
}

// enqueuer builds the term's enqueuer in the change identity mode the
// configuration and the source decide, its counter seeded from claims in
// digest mode.
func (t *tenure) enqueuer(stream *binlog.Stream, claims []string) (*enqueuer, error) {
	e, cfg, l := t.e, t.e.cfg, t.lease
	info := stream.Info()
	digestMode := false
	switch cfg.ChangeIdentity {
	case "digest":
		digestMode = true
	case "auto":
		digestMode = !info.GTIDMode
	case "gtid":
		if !info.GTIDMode {
			return nil, errors.New("change_identity gtid: the source server does not use GTIDs (enable gtid_mode, or use --change-identity auto|digest)")
		}
	}
	q := &enqueuer{
		store:       t.store,
		log:         e.log,
		instance:    cfg.Instance,
		claimedBy:   cfg.ReplicaID,
		fence:       outbox.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch},
		source:      e.leaseName,
		routes:      e.routes,
		digestMode:  digestMode,
		batchSize:   cfg.EnqueueBatchSize,
		pipeline:    cfg.EnqueuePipeline,
		maxBuffer:   cfg.EnqueueMaxBuffer,
		maxRowBytes: cfg.MaxRowBytes,
		interval:    cfg.EnqueueFlushInterval,
		written:     func(pipes []string) { t.drains.segmentsWritten(pipes); t.e.hb.enqueued(pipes) },
		valid:       func() bool { return t.keeper.Lease().Valid(time.Now()) },
		observe:     e.metrics.ObserveEnqueue,
		report:      func(err error) { e.noteWrite(writeEnqueue, err) },
		lastRow:     -1,
		hook:        e.newWatermarkHook(t.db),
		position:    stream.ReadPosition,
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
	return q, nil
}

// enqueue writes the taken-over events, then the stream's, until the term
// ends; on a graceful stop (ctx, the Run's, ended with the lease held) the
// complete transactions still buffered are written.
func (t *tenure) enqueue(ctx context.Context, q *enqueuer, stream *binlog.Stream, buffered []binlog.Event) error {
	e := t.e
	tickErr := t.startTicker(q)
	defer func() {
		// The term is over whatever ended it: end the write in flight (a
		// graceful stop has collected it already) before the next term
		// can start one.
		t.cancel()
		q.stop()
	}()
	handle := func(ctx context.Context, ev binlog.Event) error {
		e.observeEvent(ev)
		return q.handle(ctx, ev)
	}
	var err error
	for _, ev := range buffered {
		if err = handle(t.ctx, ev); err != nil {
			break
		}
	}
	buffered = nil
	if err == nil {
		err = stream.Run(t.ctx, handle)
	}
	select {
	case terr := <-tickErr:
		err = terr
	default:
	}
	lost := t.lost()
	if ctx.Err() != nil && !lost && !errors.Is(err, errLeaseLost) {
		// Graceful stop: write the complete transactions still buffered,
		// fenced by the lease we still hold.
		fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
		ferr := q.final(fctx)
		fcancel()
		if ferr != nil {
			e.log.Warn("write last batch on stop; it is read again from the checkpoint", zap.Error(ferr))
		}
		e.log.Info("enqueue stopped", zap.Int64("records_written", q.recordsWritten), zap.Int64("batches", q.flushes),
			zap.Duration("in_transactions", q.flushTime), zap.Duration("waited", q.waitTime))
		return nil
	}
	if errors.Is(err, context.Canceled) && lost {
		return errLeaseLost
	}
	return err
}

// startTicker writes batches of an idle stream until the term ends; an
// error ends the term and is sent on the returned channel.
func (t *tenure) startTicker(q *enqueuer) <-chan error {
	tickErr := make(chan error, 1)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		// The idle flush; a read-only backfill's open windows want quicker
		// ticks (backfill_hook.go).
		every := max(t.e.cfg.EnqueueFlushInterval/2, 5*time.Millisecond)
		ctx, stop := context.WithCancel(t.ctx)
		defer stop()
		pause.Repeat(ctx, func() time.Duration {
			busy, err := q.tick(t.ctx)
			if err != nil {
				if t.ctx.Err() == nil {
					tickErr <- err
					t.cancel()
				}
				stop()
			}
			if busy {
				return min(busyTick, every)
			}
			return every
		})
	}()
	return tickErr
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
		if !errors.Is(err, binlog.ErrServerIDInUse) || time.Now().After(deadline) || ctx.Err() != nil {
			return s, err
		}
		e.log.Warn("server id still in use (a previous process of this replica?); retrying", zap.Uint32("server_id", bcfg.ServerID), zap.Duration("retry_in", wait))
		if err := pause.For(ctx, wait); err != nil {
			return nil, err
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
