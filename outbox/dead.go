package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	"github.com/cdcout/cdcout/state"
)

// DeadRow is a dead-lettered outbox row, as an operator inspects it
// (`cdcout dead list`, GET /v1/dead and the dashboard).
type DeadRow struct {
	ID   string `json:"id"`
	Pipe string `json:"pipe"`
	Sink string `json:"sink"`
	// Table is the row's "db.table".
	Table string `json:"table"`
	// RowKey is the row's key as JSON ({"id":42}), cut to
	// DeadQuery.KeyChars when that is set.
	RowKey      string     `json:"rowKey"`
	Op          string     `json:"op"`
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"lastError"`
	LastErrorAt *time.Time `json:"lastErrorAt,omitempty"`
	CommitTime  *time.Time `json:"commitTime,omitempty"`
	CreatedAt   time.Time  `json:"createdAt"`
}

// DeadQuery selects dead rows.
type DeadQuery struct {
	// Pipe is one pipe; "" for every pipe named Prefix… ("" for all).
	Pipe, Prefix string
	// NewestFirst orders by enqueue time, newest first; else by id
	// (commit order), oldest first.
	NewestFirst bool
	// Limit is the most rows returned; 0 for all.
	Limit int
	// KeyChars cuts each row key to that many characters (a key of wide
	// columns can be long); 0 keeps it whole.
	KeyChars int
}

// DeadRows returns the dead rows q selects.
func (s *Store) DeadRows(ctx context.Context, q DeadQuery) ([]DeadRow, error) {
	key := "row_key"
	if q.KeyChars > 0 {
		key = "LEFT(row_key, " + strconv.Itoa(q.KeyChars) + ")"
	}
	query := `SELECT id, pipe, sink, db, tbl, ` + key + `, op, attempts, last_error, last_error_at, commit_ts, created_at
FROM ` + s.outbox + ` WHERE status = 'dead'`
	var args []any
	switch {
	case q.Pipe != "":
		query += ` AND pipe = ?`
		args = append(args, q.Pipe)
	case q.Prefix != "":
		query += ` AND pipe LIKE ?`
		args = append(args, state.LikePrefix(q.Prefix))
	}
	if q.NewestFirst {
		query += ` ORDER BY created_at DESC, id DESC`
	} else {
		query += ` ORDER BY id`
	}
	if q.Limit > 0 {
		query += ` LIMIT ?`
		args = append(args, q.Limit)
	}
	out, err := state.Collect(ctx, s.db, query, args, func(rows *sql.Rows) (DeadRow, error) {
		var (
			r           DeadRow
			db, tbl     string
			lastErr     sql.NullString
			errAt, c, m sqlTime
		)
		err := rows.Scan(&r.ID, &r.Pipe, &r.Sink, &db, &tbl, &r.RowKey, &r.Op, &r.Attempts, &lastErr, &errAt, &c, &m)
		r.Table, r.LastError, r.CreatedAt = db+"."+tbl, lastErr.String, m.T
		r.LastErrorAt, r.CommitTime = timeOrNil(errAt.T), timeOrNil(c.T)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead rows: %w", err)
	}
	if out == nil {
		out = []DeadRow{} // JSON [], not null
	}
	return out, nil
}

// timeOrNil is &t, or nil for the zero time (NULL).
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// RetryDead puts dead rows back to pending with their attempt count reset,
// due now: all dead rows, or those of one pipe, or the one with id (both
// filters may be combined). It returns how many rows were re-queued. The
// last error is kept for the record until the next attempt replaces it.
//
// A re-queued row takes its place in its key's order again: later rows of
// the same key that are still pending wait for it.
func (s *Store) RetryDead(ctx context.Context, pipe, id string) (int64, error) {
	q := `UPDATE ` + s.outbox + `
SET status = 'pending', attempts = 0, next_attempt_at = NOW(6), claimer = 0
WHERE status = 'dead'`
	var args []any
	if pipe != "" {
		q += ` AND pipe = ?`
		args = append(args, pipe)
	}
	if id != "" {
		q += ` AND id = ?`
		args = append(args, id)
	}
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("retry dead rows: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("retry dead rows: %w", err)
	}
	return n, nil
}
