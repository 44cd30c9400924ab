package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/internal/pause"
	"github.com/cdcout/cdcout/state"
)

// Retention defaults.
const (
	defaultRetention      = 72 * time.Hour
	defaultDedupWindow    = 60 * time.Second
	defaultJanitorEvery   = time.Minute
	defaultJanitorBatch   = 1000
	janitorPauseOnFailure = 10 * time.Second
)

// JanitorConfig configures a Janitor.
type JanitorConfig struct {
	DB     *sql.DB
	Schema string
	// Retention is how long delivered and dead rows, and done segments,
	// are kept after they were delivered or dead-lettered. Default 72h; the config layer maps CDCOUT_RETENTION_HOURS.
	Retention time.Duration
	// DedupWindow is how long claims are kept. It must outlive any replay
	// that could re-enqueue the same change (default max(60s, 4 × lease
	// TTL) is computed by the caller); default 60s here.
	DedupWindow time.Duration
	// Every is the pause between sweeps. Default 1 min.
	Every time.Duration
	// BatchSize bounds each DELETE, so a sweep never holds long locks or
	// builds a huge undo log. Default 1000.
	BatchSize int
	// Hold, when set, names pipes whose delivered records must stay
	// (a replay is re-delivering them); their rows and segments are not
	// swept. A Hold that fails skips the sweep of rows and segments.
	Hold   func(ctx context.Context) (map[string]bool, error)
	Logger *zap.Logger
}

// Janitor deletes what is no longer needed: outbox rows delivered or
// dead-lettered longer ago than the retention, with their attempt logs,
// segments done longer ago than the retention, claims older than the dedup
// window, and member leases of processes gone for an hour. Pending rows and
// pending segments (claimed or not) are never deleted.
type Janitor struct {
	cfg                                               JanitorConfig
	outbox, segments, attempts, claims, leases, marks string
	logger                                            *zap.Logger
}

// Swept counts what one sweep deleted.
type Swept struct {
	Rows, Attempts, Claims int64
	// Segments are done segments; the records in them that left as outbox
	// rows are counted in Rows when those go.
	Segments int64
	// Members are member leases (member/<holder>/<instance>) expired for
	// over an hour: one is left behind by every process that was killed.
	Members int64
}

// NewJanitor validates cfg, fills defaults and returns a Janitor.
func NewJanitor(cfg JanitorConfig) (*Janitor, error) {
	if cfg.DB == nil {
		return nil, errors.New("janitor: DB is nil")
	}
	if err := state.CheckName(cfg.Schema); err != nil {
		return nil, fmt.Errorf("janitor: %w", err)
	}
	orDefault(&cfg.Retention, defaultRetention)
	orDefault(&cfg.DedupWindow, defaultDedupWindow)
	orDefault(&cfg.Every, defaultJanitorEvery)
	orDefault(&cfg.BatchSize, defaultJanitorBatch)
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Janitor{
		cfg:      cfg,
		outbox:   state.Table(cfg.Schema, "outbox"),
		segments: state.Table(cfg.Schema, "segments"),
		attempts: state.Table(cfg.Schema, "attempts"),
		claims:   state.Table(cfg.Schema, "claims"),
		leases:   state.Table(cfg.Schema, "leases"),
		marks:    state.Table(cfg.Schema, "retention_marks"),
		logger:   cfg.Logger.Named("retention"),
	}, nil
}

// Run sweeps every cfg.Every until ctx ends, then returns nil. Every
// replica may run one: the deletes are idempotent and batched. The first
// sweep comes a random quarter to three quarters of Every after the start,
// not at once: a start is when a replica catches up through its backlog,
// and a restarted fleet does not sweep all at the same moment.
func (j *Janitor) Run(ctx context.Context) error {
	first := j.cfg.Every/4 + rand.N(j.cfg.Every/2+1)
	if pause.For(ctx, first) != nil {
		return nil
	}
	pause.Repeat(ctx, func() time.Duration {
		sw, err := j.Sweep(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			j.logger.Warn("retention sweep", zap.Error(err))
			return min(j.cfg.Every, janitorPauseOnFailure)
		case sw.Rows+sw.Segments+sw.Claims+sw.Members > 0:
			j.logger.Info("retention sweep", zap.Int64("rows", sw.Rows), zap.Int64("segments", sw.Segments),
				zap.Int64("attempts", sw.Attempts), zap.Int64("claims", sw.Claims), zap.Int64("member_leases", sw.Members))
		}
		return j.cfg.Every
	})
	return nil
}

// Sweep deletes everything currently past retention, batch by batch.
func (j *Janitor) Sweep(ctx context.Context) (Swept, error) {
	var sw Swept
	pipes, err := j.pipes(ctx)
	if err != nil {
		return sw, fmt.Errorf("list outbox pipes: %w", err)
	}
	held := map[string]bool{}
	if j.cfg.Hold != nil {
		if held, err = j.cfg.Hold(ctx); err != nil {
			return sw, fmt.Errorf("read the pipes replays hold: %w", err)
		}
	}
	for _, pipe := range pipes {
		if held[pipe] {
			continue
		}
		for _, status := range []Status{StatusDelivered, StatusDead} {
			for {
				rows, atts, err := j.sweepRows(ctx, pipe, status)
				sw.Rows += rows
				sw.Attempts += atts
				if err != nil {
					return sw, fmt.Errorf("delete old outbox rows of %s: %w", pipe, err)
				}
				if rows < int64(j.cfg.BatchSize) {
					break
				}
			}
		}
		for {
			n, more, err := j.sweepSegments(ctx, pipe)
			sw.Segments += n
			if err != nil {
				return sw, fmt.Errorf("delete old segments of %s: %w", pipe, err)
			}
			if !more {
				break
			}
		}
	}
	if sw.Claims, err = j.batches(ctx, j.sweepClaims); err != nil {
		return sw, fmt.Errorf("delete old claims: %w", err)
	}
	if sw.Members, err = j.batches(ctx, j.sweepMembers); err != nil {
		return sw, fmt.Errorf("delete old member leases: %w", err)
	}
	return sw, nil
}

// batches runs sweep batch by batch (each in readCommitted) until one
// deletes less than a whole batch, and returns what they deleted.
func (j *Janitor) batches(ctx context.Context, sweep func(context.Context, *sql.Tx) (int64, error)) (int64, error) {
	var total int64
	for {
		n, err := j.readCommitted(ctx, sweep)
		total += n
		if err != nil || n < int64(j.cfg.BatchSize) {
			return total, err
		}
	}
}

// readCommitted runs one batch of a sweep in a READ COMMITTED transaction
// and commits it: no gap locks, so a sweep never blocks what is inserted
// beside the records it deletes. It returns what sweep deleted.
func (j *Janitor) readCommitted(ctx context.Context, sweep func(context.Context, *sql.Tx) (int64, error)) (int64, error) {
	tx, err := j.cfg.DB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	n, err := sweep(ctx, tx)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return n, nil
}

// sweepClaims deletes one batch of claims older than the dedup window.
//
// It reads the batch's keys with a plain read and deletes them by primary
// key, in READ COMMITTED, rather than with one
// "DELETE … WHERE created_at < … LIMIT n". That statement, in REPEATABLE
// READ, walks the created_at index with next-key locks up to the first
// record past the range: a claim an enqueue transaction has just inserted
// and not committed. The sweep then waits for that transaction holding a
// gap lock in front of it, and every other enqueue transaction's claim
// with an earlier created_at waits on that gap. When the one waited for is
// itself waiting, in cdcout rather than in InnoDB, for an earlier enqueue
// transaction to commit (enqueues commit in record-id order), the cycle is
// one no deadlock detector sees: it lasts until a lock wait timeout. Here
// nothing the sweep takes is a gap, and what it locks is only claims past
// the window, which no enqueue touches.
func (j *Janitor) sweepClaims(ctx context.Context, tx *sql.Tx) (int64, error) {
	window := j.cfg.DedupWindow.Microseconds()
	old, err := state.Collect(ctx, tx, `SELECT pipe, change_key FROM `+j.claims+`
WHERE created_at < NOW(6) - INTERVAL ? MICROSECOND ORDER BY created_at LIMIT ?`, []any{window, j.cfg.BatchSize},
		func(r *sql.Rows) (c [2]string, err error) { return c, r.Scan(&c[0], &c[1]) })
	if err != nil {
		return 0, err
	}
	byPipe := map[string][]any{}
	var order []string
	for _, c := range old {
		if byPipe[c[0]] == nil {
			order = append(order, c[0])
		}
		byPipe[c[0]] = append(byPipe[c[0]], c[1])
	}
	var n int64
	for _, pipe := range order {
		keys := byPipe[pipe]
		// The window again: a claim taken again since the read stays.
		// FORCE INDEX (PRIMARY): on the created_at index, which the
		// optimizer may prefer for a small table, the delete would walk
		// into, and wait on, an enqueue transaction's fresh claim.
		args := append(append([]any{pipe}, keys...), window)
		res, err := tx.ExecContext(ctx, `DELETE `+j.claims+` FROM `+j.claims+` FORCE INDEX (PRIMARY)
WHERE pipe = ? AND change_key IN (`+state.Placeholders(len(keys))+`) AND created_at < NOW(6) - INTERVAL ? MICROSECOND`, args...)
		if err != nil {
			return 0, err
		}
		d, _ := res.RowsAffected()
		n += d
	}
	return n, nil
}

// sweepMembers deletes one batch of member leases
// (member/<holder>/<instance>) expired for over an hour. Member leases
// only count live replicas; an expired one is never renewed again (its
// holder name carries the dead process's nonce). As sweepClaims: a plain
// read, then deletes by primary key, so no gap lock sits in front of a
// lease being taken.
func (j *Janitor) sweepMembers(ctx context.Context, tx *sql.Tx) (int64, error) {
	names, err := state.Strings(ctx, tx, `SELECT name FROM `+j.leases+`
WHERE name LIKE 'member/%' AND expires_at < NOW(6) - INTERVAL 1 HOUR LIMIT ?`, j.cfg.BatchSize)
	if err != nil || len(names) == 0 {
		return 0, err
	}
	args := make([]any, len(names))
	for i, name := range names {
		args[i] = name
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM `+j.leases+` WHERE name IN (`+state.Placeholders(len(names))+`)
AND name LIKE 'member/%' AND expires_at < NOW(6) - INTERVAL 1 HOUR`, args...)
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// pipes lists the pipes that have outbox rows or segments.
func (j *Janitor) pipes(ctx context.Context) ([]string, error) {
	return NewStore(j.cfg.DB, j.cfg.Schema, nil).PipesWithRecords(ctx, "", "")
}

// sweepSegments deletes one batch of a pipe's segments done longer ago than
// the retention, and reports whether a next batch may find more. A done
// segment's next_attempt_at is when it was done, by the state database's
// clock, and a pipe's segments are done one at a time in id order, so the
// old ones are the oldest ids of the fifo index range (pipe, 'done'): the
// batch reads the first BatchSize of them and deletes those past the
// retention. Reading a bounded batch rather than deleting with
// "… AND next_attempt_at < ? ORDER BY id LIMIT n" keeps the last, short
// batch of every sweep from walking (and, in REPEATABLE READ, locking)
// every done segment still retained.
func (j *Janitor) sweepSegments(ctx context.Context, pipe string) (n int64, more bool, err error) {
	r, err := j.cfg.DB.QueryContext(ctx, `SELECT id, last_id, next_attempt_at < NOW(6) - INTERVAL ? MICROSECOND FROM `+j.segments+`
WHERE pipe = ? AND status = 'done' ORDER BY id LIMIT ?`, j.cfg.Retention.Microseconds(), pipe, j.cfg.BatchSize)
	if err != nil {
		return 0, false, err
	}
	var ids []any
	read, young, newest := 0, false, ""
	for r.Next() {
		var (
			id, last string
			old      bool
		)
		if err := r.Scan(&id, &last, &old); err != nil {
			r.Close()
			return 0, false, err
		}
		read++
		if old {
			ids = append(ids, id)
			newest = max(newest, last)
		} else {
			young = true
		}
	}
	r.Close()
	if err := r.Err(); err != nil {
		return 0, false, err
	}
	if len(ids) == 0 {
		return 0, false, nil
	}
	// The conditions again: whatever happened since the read, a pending or
	// recently done segment is never deleted.
	res, err := j.cfg.DB.ExecContext(ctx, `DELETE FROM `+j.segments+` WHERE id IN (`+state.Placeholders(len(ids))+`)
AND status = 'done' AND next_attempt_at < NOW(6) - INTERVAL ? MICROSECOND`, append(ids, j.cfg.Retention.Microseconds())...)
	if err != nil {
		return 0, false, err
	}
	if n, _ = res.RowsAffected(); n > 0 {
		if err := j.markDeleted(ctx, j.cfg.DB, pipe, newest); err != nil {
			return n, false, err
		}
	}
	return n, !young && read == j.cfg.BatchSize, nil
}

// markDeleted records that retention deleted pipe's records up to id
// (state migration 5, retention_marks): a replay from before a pipe's
// oldest held record is refused only where something was deleted.
func (j *Janitor) markDeleted(ctx context.Context, ex interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, pipe, id string) error {
	_, err := ex.ExecContext(ctx, `INSERT INTO `+j.marks+` (pipe, deleted_to) VALUES (?, ?)
ON DUPLICATE KEY UPDATE deleted_to = GREATEST(deleted_to, VALUES(deleted_to)), updated_at = NOW(6)`, pipe, id)
	return err
}

// sweepRows deletes one batch of a pipe's old rows in status (delivered or
// dead) and their attempt logs in one transaction. A done row's
// next_attempt_at is when it was done, so the batch is one range of the
// due index (pipe, status, next_attempt_at, id): the outbox has no index
// of its own for retention, which would cost every insert and every
// delivery one more index write.
func (j *Janitor) sweepRows(ctx context.Context, pipe string, status Status) (rows, atts int64, err error) {
	// READ COMMITTED: no gap locks on the due index, so the sweep never
	// blocks the drainer moving rows to delivered meanwhile.
	rows, err = j.readCommitted(ctx, func(ctx context.Context, tx *sql.Tx) (int64, error) {
		// FOR UPDATE locks the chosen rows, so a concurrent dead-letter retry
		// either happens first (and the row is no longer chosen) or waits.
		chosen, err := state.Strings(ctx, tx, `SELECT id FROM `+j.outbox+`
WHERE pipe = ? AND status = ? AND next_attempt_at < NOW(6) - INTERVAL ? MICROSECOND
ORDER BY next_attempt_at LIMIT ? FOR UPDATE`, pipe, string(status), j.cfg.Retention.Microseconds(), j.cfg.BatchSize)
		if err != nil || len(chosen) == 0 {
			return 0, err
		}
		ids := make([]any, len(chosen))
		for i, id := range chosen {
			ids[i] = id
		}
		in := state.Placeholders(len(ids))
		res, err := tx.ExecContext(ctx, `DELETE FROM `+j.attempts+` WHERE outbox_id IN (`+in+`)`, ids...)
		if err != nil {
			return 0, err
		}
		atts, _ = res.RowsAffected()
		// The status condition again, as a belt to FOR UPDATE's braces:
		// whatever happens, a pending row is never deleted.
		res, err = tx.ExecContext(ctx, `DELETE FROM `+j.outbox+` WHERE id IN (`+in+`) AND status IN ('delivered','dead')`, ids...)
		if err != nil {
			return 0, err
		}
		n, _ := res.RowsAffected()
		if n > 0 {
			if err := j.markDeleted(ctx, tx, pipe, slices.Max(chosen)); err != nil {
				return 0, err
			}
		}
		return n, nil
	})
	if err != nil {
		return 0, 0, err
	}
	return rows, atts, nil
}
