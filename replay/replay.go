// Package replay keeps the replays operators ask for (cdcout sink replay,
// POST /v1/sinks/{name}/replay) in the state database: the range, and per
// pipe how far the replica holding the pipe's drain lease has re-delivered
// it. Every replica of the instance reads the running replays and carries
// out those of the pipes it holds (engine/replay.go); a replica that takes
// a pipe over goes on from the recorded progress.
package replay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/cdcout/cdcout/state"
)

// The statuses of a replay and of each of its pipes.
const (
	Running = "running"
	Done    = "done"
	// Failed: a pipe that could not be replayed (its last error says
	// why), and a replay with such a pipe once no pipe of it runs.
	Failed = "failed"
)

// Status is one replay as `cdcout status`, /v1/sinks and the dashboard
// show it.
type Status struct {
	ID          int64      `json:"id"`
	Sink        string     `json:"sink"`
	From        string     `json:"from"`
	To          string     `json:"to,omitempty"`
	Status      string     `json:"status"`
	RequestedBy string     `json:"requestedBy,omitempty"`
	RequestedAt time.Time  `json:"requestedAt"`
	FinishedAt  *time.Time `json:"finishedAt,omitempty"`
	// Delivered and Failed sum the pipes': records re-delivered, and
	// records the sink refused for good (they are not retried).
	Delivered int64          `json:"delivered"`
	Failed    int64          `json:"failed"`
	Pipes     []PipeProgress `json:"pipes"`
	// Waiting says why a running replay makes no progress (its sink is
	// paused); set by the reader, not stored.
	Waiting string `json:"waiting,omitempty"`
	// MaxID is the newest record id the replay re-delivers: what the
	// outbox held when it was asked for.
	MaxID string `json:"-"`
}

// PipeProgress is how far one pipe of a replay is.
type PipeProgress struct {
	Pipe      string    `json:"pipe"`
	Status    string    `json:"status"`
	LastID    string    `json:"lastId,omitempty"`
	Delivered int64     `json:"delivered"`
	Failed    int64     `json:"failed"`
	LastError string    `json:"lastError,omitempty"`
	Holder    string    `json:"holder,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// ErrRunning is returned by Start when the sink already has a running
// replay.
var ErrRunning = errors.New("the sink has a replay running")

// Start records a replay of sink's pipes in rng up to the record maxID,
// by whom asked, and returns its id. Only one replay per sink runs at a
// time.
func Start(ctx context.Context, db *sql.DB, schema, instance, sink string, rng Range, pipes []string, maxID, by string) (int64, error) {
	if err := state.CheckName(schema); err != nil {
		return 0, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("start replay: %w", err)
	}
	defer tx.Rollback()
	var running int64
	err = tx.QueryRowContext(ctx, `SELECT id FROM `+state.Table(schema, "replays")+` WHERE instance = ? AND status = 'running' AND sink = ? LIMIT 1 FOR UPDATE`,
		instance, sink).Scan(&running)
	switch {
	case err == nil:
		return 0, fmt.Errorf("%w (replay %d); wait until it is done (cdcout status shows it)", ErrRunning, running)
	case !errors.Is(err, sql.ErrNoRows):
		return 0, fmt.Errorf("start replay: %w", err)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO `+state.Table(schema, "replays")+` (instance, sink, range_from, range_to, max_id, requested_by)
VALUES (?, ?, ?, ?, ?, ?)`, instance, sink, rng.From.Text, rng.To.Text, maxID, by)
	if err != nil {
		return 0, fmt.Errorf("start replay: %w", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("start replay: %w", err)
	}
	for _, pipe := range pipes {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+state.Table(schema, "replay_pipes")+` (replay_id, pipe) VALUES (?, ?)`, id, pipe); err != nil {
			return 0, fmt.Errorf("start replay: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("start replay: %w", err)
	}
	return id, nil
}

// List returns instance's running replays and its latest finished ones
// (up to done of them), newest first, with their pipes.
func List(ctx context.Context, db *sql.DB, schema, instance string, done int) ([]Status, error) {
	if err := state.CheckName(schema); err != nil {
		return nil, err
	}
	out, err := state.Collect(ctx, db, `(SELECT id, sink, range_from, range_to, max_id, status, requested_by, requested_at, finished_at
  FROM `+state.Table(schema, "replays")+` WHERE instance = ? AND status = 'running')
UNION ALL
(SELECT id, sink, range_from, range_to, max_id, status, requested_by, requested_at, finished_at
  FROM `+state.Table(schema, "replays")+` WHERE instance = ? AND status <> 'running' ORDER BY id DESC LIMIT ?)
ORDER BY id DESC`, []any{instance, instance, done}, func(rows *sql.Rows) (Status, error) {
		var (
			s       Status
			at, fin state.Time
		)
		err := rows.Scan(&s.ID, &s.Sink, &s.From, &s.To, &s.MaxID, &s.Status, &s.RequestedBy, &at, &fin)
		s.RequestedAt = at.T
		if !fin.T.IsZero() {
			t := fin.T
			s.FinishedAt = &t
		}
		return s, err
	})
	if err != nil || len(out) == 0 {
		return nil, wrapErr("read replays", err)
	}
	byID := map[int64]int{}
	ids := make([]any, 0, len(out))
	for i, s := range out {
		byID[s.ID] = i
		ids = append(ids, s.ID)
	}
	type pipeOf struct {
		id int64
		p  PipeProgress
	}
	pipes, err := state.Collect(ctx, db, `SELECT replay_id, pipe, status, last_id, delivered, failed, COALESCE(last_error, ''), holder, updated_at
FROM `+state.Table(schema, "replay_pipes")+` WHERE replay_id IN (`+state.Placeholders(len(ids))+`) ORDER BY replay_id, pipe`, ids,
		func(rows *sql.Rows) (pipeOf, error) {
			var (
				v  pipeOf
				at state.Time
			)
			err := rows.Scan(&v.id, &v.p.Pipe, &v.p.Status, &v.p.LastID, &v.p.Delivered, &v.p.Failed, &v.p.LastError, &v.p.Holder, &at)
			v.p.UpdatedAt = at.T
			return v, err
		})
	if err != nil {
		return nil, fmt.Errorf("read replay pipes: %w", err)
	}
	for _, v := range pipes {
		s := &out[byID[v.id]]
		s.Pipes = append(s.Pipes, v.p)
		s.Delivered += v.p.Delivered
		s.Failed += v.p.Failed
	}
	return out, nil
}

// wrapErr is fmt.Errorf("what: %w") for a non-nil err, else nil.
func wrapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Active returns instance's running replays.
func Active(ctx context.Context, db *sql.DB, schema, instance string) ([]Status, error) {
	all, err := List(ctx, db, schema, instance, 0)
	if err != nil {
		return nil, err
	}
	var out []Status
	for _, s := range all {
		if s.Status == Running {
			out = append(out, s)
		}
	}
	return out, nil
}

// Progress records how far holder has re-delivered pipe of replay id:
// up to the record lastID, with delivered and failed more records, and
// the last error ("" for none).
func Progress(ctx context.Context, db *sql.DB, schema string, id int64, pipe, lastID string, delivered, failed int64, lastErr, holder string) error {
	if err := state.CheckName(schema); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `UPDATE `+state.Table(schema, "replay_pipes")+`
SET last_id = GREATEST(last_id, ?), delivered = delivered + ?, failed = failed + ?, last_error = NULLIF(?, ''), holder = ?, updated_at = NOW(6)
WHERE replay_id = ? AND pipe = ? AND status = 'running'`, lastID, delivered, failed, lastErr, holder, id, pipe); err != nil {
		return fmt.Errorf("record replay %d progress of %s: %w", id, pipe, err)
	}
	return nil
}

// FinishPipe marks pipe of replay id done, and the replay once every
// pipe of it is.
func FinishPipe(ctx context.Context, db *sql.DB, schema string, id int64, pipe, holder string) error {
	if err := state.CheckName(schema); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `UPDATE `+state.Table(schema, "replay_pipes")+` SET status = 'done', holder = ?, updated_at = NOW(6)
WHERE replay_id = ? AND pipe = ?`, holder, id, pipe); err != nil {
		return fmt.Errorf("finish replay %d of %s: %w", id, pipe, err)
	}
	return finishReplay(ctx, db, schema, id)
}

// FailPipe marks pipe of replay id failed for reason, and the replay
// (failed) once no pipe of it runs.
func FailPipe(ctx context.Context, db *sql.DB, schema string, id int64, pipe, reason, holder string) error {
	if err := state.CheckName(schema); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `UPDATE `+state.Table(schema, "replay_pipes")+` SET status = 'failed', last_error = ?, holder = ?, updated_at = NOW(6)
WHERE replay_id = ? AND pipe = ?`, reason, holder, id, pipe); err != nil {
		return fmt.Errorf("fail replay %d of %s: %w", id, pipe, err)
	}
	return finishReplay(ctx, db, schema, id)
}

// finishReplay ends replay id once no pipe of it runs: failed when a
// pipe failed, else done.
func finishReplay(ctx context.Context, db *sql.DB, schema string, id int64) error {
	pipes := state.Table(schema, "replay_pipes")
	if _, err := db.ExecContext(ctx, `UPDATE `+state.Table(schema, "replays")+`
SET status = IF(EXISTS (SELECT 1 FROM `+pipes+` WHERE replay_id = ? AND status = 'failed'), 'failed', 'done'), finished_at = NOW(6)
WHERE id = ? AND status = 'running' AND NOT EXISTS
  (SELECT 1 FROM `+pipes+` WHERE replay_id = ? AND status = 'running')`, id, id, id); err != nil {
		return fmt.Errorf("finish replay %d: %w", id, err)
	}
	return nil
}

// HeldPipes are the pipes (of every instance) a running replay still has
// to re-deliver: retention leaves their records alone.
func HeldPipes(ctx context.Context, db *sql.DB, schema string) (map[string]bool, error) {
	if err := state.CheckName(schema); err != nil {
		return nil, err
	}
	pipes, err := state.Strings(ctx, db, `SELECT DISTINCT pipe FROM `+state.Table(schema, "replay_pipes")+` WHERE status = 'running'`)
	if err != nil {
		return nil, fmt.Errorf("read replayed pipes: %w", err)
	}
	out := make(map[string]bool, len(pipes))
	for _, p := range pipes {
		out[p] = true
	}
	return out, nil
}
