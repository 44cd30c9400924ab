package engine

import (
	"context"
	"database/sql"
	"slices"
	"time"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/buildinfo"
	"github.com/cdcout/cdcout/outbox"
)

// WatermarkHook is the stream side of backfills (backfill.Applier): the
// enqueuer shows it every decoded change before routing, and tells it
// after each enqueue transaction commits.
type WatermarkHook interface {
	// Change returns consumed for the hook's own bookkeeping rows (never
	// routed) and backfilled rows to enqueue at this point of the stream,
	// ahead of every later change.
	Change(ctx context.Context, ch *canonical.Change) (consumed bool, rows []backfill.Row, err error)
	// Handed is a mark of the rows Change handed out so far, taken when
	// a batch is cut.
	Handed() int
	// Written: every row handed out by Change before mark is in the
	// outbox. Later ones may be in the batch being built while this one
	// was written.
	Written(ctx context.Context, mark int)
	// Tick (between events, from the flush ticker) and Committed (after a
	// transaction's commit) serve read-only backfills, whose windows are
	// fenced by stream positions: they return rows to enqueue there.
	Tick(ctx context.Context, pos binlog.Position, between bool) ([]backfill.Row, error)
	Committed(ctx context.Context, pos binlog.Position) ([]backfill.Row, error)
	// Busy: Tick is wanted every couple of milliseconds.
	Busy() bool
}

// busyTick is the flush ticker's period while the hook is busy.
const busyTick = 2 * time.Millisecond

// newWatermarkHook is the hook of one tenure's stream.
func (e *Engine) newWatermarkHook(db *sql.DB) *backfill.Applier {
	return backfill.NewApplier(db, e.cfg.StateDB, e.cfg.Instance, buildinfo.Version(), e.log)
}

// withWatermarkTable adds the watermark table to an explicit capture list
// (nil already means every table).
func withWatermarkTable(include []string, wm string) []string {
	if len(include) == 0 || slices.Contains(include, wm) {
		return include
	}
	return append(slices.Clone(include), wm)
}

// hookChange runs the watermark hook on ch. It returns true when ch must
// not be routed. Backfilled rows go straight to ready: a watermark is
// alone in its transaction, so every earlier transaction is keyed and in
// ready already, and ready's order is the outbox id order.
func (q *enqueuer) hookChange(ctx context.Context, ch *canonical.Change) (bool, error) {
	consumed, rows, err := q.hook.Change(ctx, ch)
	if err != nil {
		return true, err
	}
	q.routeBackfilled(rows)
	return consumed, nil
}

// hookCommitted enqueues the read-only backfill rows due at the commit
// just keyed (at pos).
func (q *enqueuer) hookCommitted(ctx context.Context, pos binlog.Position) error {
	rows, err := q.hook.Committed(ctx, pos)
	q.routeBackfilled(rows)
	return err
}

// hookTick lets the hook arm and fence read-only windows between events;
// rows it returns are written at once (the stream may be idle).
func (q *enqueuer) hookTick(ctx context.Context) error {
	if q.hook == nil || q.position == nil {
		return nil
	}
	rows, err := q.hook.Tick(ctx, q.position(), q.lastRow == -1 && len(q.open) == 0)
	if err != nil || len(rows) == 0 {
		return err
	}
	q.routeBackfilled(rows)
	return q.flush(ctx, q.cp)
}

// routeBackfilled puts backfilled rows into ready for every sink they are
// for.
func (q *enqueuer) routeBackfilled(rows []backfill.Row) {
	for _, br := range rows {
		for _, r := range q.routes {
			if br.Sinks != nil && !slices.Contains(br.Sinks, r.sink) {
				continue
			}
			if !r.matches(br.Change) {
				continue
			}
			pipe := outbox.PipeName(q.instance, br.Change.Source.DB, br.Change.Source.Table, r.sink)
			c := r.mask(br.Change)
			filtered, dead := r.filterOut(br.Change)
			q.ready = append(q.ready, outbox.Pending{
				Pipe: pipe, Sink: r.sink, Change: c, ChangeKey: br.ChangeKey, Unit: br.Unit,
				Digest: canonical.DigestChange(pipe, c), Filtered: filtered, Dead: dead,
			})
		}
	}
	q.maxBuffered = max(q.maxBuffered, len(q.ready)+len(q.open))
}
