package backfill

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cdcout/cdcout/state"
)

// runStore is the state SQL of one backfill's Runner: its backfills row,
// its chunks and its fences (issue 15: SQL against state tables behind one
// type in the package that owns them).
type runStore struct {
	db                    *sql.DB
	schema                string
	id                    string
	fills, chunks, fences string
}

func newRunStore(db *sql.DB, schema string) *runStore {
	return &runStore{db: db, schema: schema,
		fills:  state.Table(schema, "backfills"),
		chunks: state.Table(schema, "backfill_chunks"),
		fences: state.Table(schema, "backfill_fences")}
}

// create records a new backfill (status running).
func (s *runStore) create(ctx context.Context, spec Spec, m meta, estimate int64) error {
	raw, _ := json.Marshal(m)
	if _, err := s.db.ExecContext(ctx, "INSERT INTO "+s.fills+" (id, tbl, sinks, where_sql, rows_estimate, status) VALUES (?, ?, ?, ?, ?, ?)",
		s.id, spec.Table, string(raw), nullable(spec.Where), estimate, StatusRunning); err != nil {
		return fmt.Errorf("record backfill: %w", err)
	}
	return nil
}

// errEnded: the backfill being resumed or linked to ended (done, failed
// by another run, cancelled) after it was read.
var errEnded = errors.New("the backfill ended meanwhile")

// reopen sets a resumed backfill running again, unless it ended since it
// was read (errEnded): a cancelled backfill stays cancelled.
func (s *runStore) reopen(ctx context.Context, estimate int64) error {
	res, err := s.db.ExecContext(ctx, "UPDATE "+s.fills+" SET status = ?, error = NULL, rows_estimate = ?, updated_at = NOW(6) WHERE id = ? AND status IN (?, ?)",
		StatusRunning, estimate, s.id, StatusRunning, StatusFailed)
	if err != nil {
		return fmt.Errorf("record backfill: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("record backfill: %w", err)
	} else if n == 0 {
		return errEnded
	}
	return nil
}

// ended records a running backfill's error: failed, or (keepRunning) still
// running for the next run to resume.
func (s *runStore) ended(ctx context.Context, cause error, keepRunning bool) {
	if keepRunning {
		_, _ = s.db.ExecContext(ctx, "UPDATE "+s.fills+" SET error = ?, updated_at = NOW(6) WHERE id = ? AND status = ?",
			cause.Error(), s.id, StatusRunning)
		return
	}
	_ = end(ctx, s.db, s.schema, s.id, StatusFailed, cause.Error())
}

// chunkState is a chunk's row as the applier left it.
type chunkState struct {
	status  string
	emitted int
}

// chunkStates reads the states of chunks nos (a missing chunk was dropped:
// cancelled).
func (s *runStore) chunkStates(ctx context.Context, nos []int64) (map[int64]chunkState, error) {
	args := make([]any, 0, len(nos)+1)
	args = append(args, s.id)
	for _, no := range nos {
		args = append(args, no)
	}
	rows, err := s.db.QueryContext(ctx, "SELECT chunk, status, emitted FROM "+s.chunks+" WHERE backfill_id = ? AND chunk IN ("+state.Placeholders(len(nos))+")", args...)
	if err != nil {
		return nil, fmt.Errorf("read backfill chunks: %w", err)
	}
	defer rows.Close()
	out := map[int64]chunkState{}
	for rows.Next() {
		var no int64
		var c chunkState
		if err := rows.Scan(&no, &c.status, &c.emitted); err != nil {
			return nil, fmt.Errorf("read backfill chunks: %w", err)
		}
		out[no] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read backfill chunks: %w", err)
	}
	return out, nil
}

// progress records the completed prefix; recorded is false when the
// backfill no longer runs (cancelled meanwhile).
func (s *runStore) progress(ctx context.Context, lastKey string, m meta, rows int64) (recorded bool, err error) {
	raw, _ := json.Marshal(m)
	res, err := s.db.ExecContext(ctx, "UPDATE "+s.fills+" SET last_key = ?, sinks = ?, rows_done = ?, updated_at = NOW(6) WHERE id = ? AND status = ?",
		lastKey, string(raw), rows, s.id, StatusRunning)
	if err != nil {
		return false, fmt.Errorf("record backfill progress: %w", err)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// dropChunks deletes chunks nos and their fences.
func (s *runStore) dropChunks(ctx context.Context, nos ...int64) error {
	args := make([]any, 0, len(nos)+1)
	args = append(args, s.id)
	for _, no := range nos {
		args = append(args, no)
	}
	for _, t := range []string{s.chunks, s.fences} {
		if _, err := s.db.ExecContext(ctx, "DELETE FROM "+t+" WHERE backfill_id = ? AND chunk IN ("+state.Placeholders(len(nos))+")", args...); err != nil {
			return fmt.Errorf("drop backfill chunks: %w", err)
		}
	}
	return nil
}

// cancelled reports ErrCancelled for a cancelled backfill.
func (s *runStore) cancelled(ctx context.Context) error {
	var status string
	if err := s.db.QueryRowContext(ctx, "SELECT status FROM "+s.fills+" WHERE id = ?", s.id).Scan(&status); err != nil {
		return fmt.Errorf("read backfill status: %w", err)
	}
	if status == StatusCancelled {
		return ErrCancelled
	}
	return nil
}

// storeChunk stores a chunk's rows for the applier (status written).
func (s *runStore) storeChunk(ctx context.Context, f *flight, buf []byte, n int) error {
	if _, err := s.db.ExecContext(ctx, "INSERT INTO "+s.chunks+" (backfill_id, chunk, start_key, end_key, rows_json, row_count, status) VALUES (?, ?, ?, ?, ?, ?, ?)",
		s.id, f.no, nullable(f.start.encode()), f.end.encode(), buf, n, chunkWritten); err != nil {
		return fmt.Errorf("store backfill chunk: %w", err)
	}
	return nil
}

// chunkRanges are the recorded chunks' key ranges, end by start (both
// encoded keyArgs; "" starts at the first row).
func (s *runStore) chunkRanges(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.QueryContext(ctx, "SELECT COALESCE(start_key, ''), end_key FROM "+s.chunks+
		" WHERE backfill_id = ? AND end_key IS NOT NULL", s.id)
	if err != nil {
		return nil, fmt.Errorf("read unfinished backfill chunks: %w", err)
	}
	defer rows.Close()
	byStart := map[string]string{}
	for rows.Next() {
		var start, end string
		if err := rows.Scan(&start, &end); err != nil {
			return nil, fmt.Errorf("read unfinished backfill chunks: %w", err)
		}
		byStart[start] = end
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read unfinished backfill chunks: %w", err)
	}
	return byStart, nil
}

// nextChunk is a chunk number above every recorded one.
func (s *runStore) nextChunk(ctx context.Context) (int64, error) {
	var next int64
	if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(MAX(chunk) + 1, 0) FROM "+s.chunks+" WHERE backfill_id = ?", s.id).Scan(&next); err != nil {
		return 0, fmt.Errorf("read backfill chunks: %w", err)
	}
	return next, nil
}

// clear deletes every chunk and fence of the backfill.
func (s *runStore) clear(ctx context.Context) error {
	for _, t := range []string{s.chunks, s.fences} {
		if _, err := s.db.ExecContext(ctx, "DELETE FROM "+t+" WHERE backfill_id = ?", s.id); err != nil {
			return fmt.Errorf("clear backfill chunks: %w", err)
		}
	}
	return nil
}

// done records the backfill done.
func (s *runStore) done(ctx context.Context) error {
	if err := end(ctx, s.db, s.schema, s.id, StatusDone, ""); err != nil {
		return fmt.Errorf("record backfill done: %w", err)
	}
	return nil
}

// askFence asks the stream to open chunk no's window.
func (s *runStore) askFence(ctx context.Context, no int64, instance, table string) error {
	if _, err := s.db.ExecContext(ctx, "INSERT INTO "+s.fences+" (backfill_id, chunk, instance, tbl, status) VALUES (?, ?, ?, ?, ?)"+
		" ON DUPLICATE KEY UPDATE status = VALUES(status), armed_at = NULL, high = NULL, updated_at = NOW(6)",
		s.id, no, instance, table, fenceArming); err != nil {
		return fmt.Errorf("ask the stream to open a backfill window: %w", err)
	}
	return nil
}

// fence reads chunk no's fence: its status and, once armed, where the
// stream opened the window; found is false when the row is gone.
func (s *runStore) fence(ctx context.Context, no int64) (status string, armedAt sql.NullString, found bool, err error) {
	err = s.db.QueryRowContext(ctx, "SELECT status, armed_at FROM "+s.fences+" WHERE backfill_id = ? AND chunk = ?", s.id, no).Scan(&status, &armedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return "", armedAt, false, nil
	}
	if err != nil {
		return "", armedAt, false, fmt.Errorf("read backfill fence: %w", err)
	}
	return status, armedAt, true, nil
}

// fenced records chunk no's high position; ok is false when its window
// was given up meanwhile.
func (s *runStore) fenced(ctx context.Context, no int64, high position) (ok bool, err error) {
	raw, _ := json.Marshal(high)
	res, err := s.db.ExecContext(ctx, "UPDATE "+s.fences+" SET status = ?, high = ?, updated_at = NOW(6) WHERE backfill_id = ? AND chunk = ? AND status = ?",
		fenceFenced, string(raw), s.id, no, fenceArmed)
	if err != nil {
		return false, fmt.Errorf("fence backfill chunk: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}
