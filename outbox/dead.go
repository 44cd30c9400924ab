package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/cdcout/cdcout/state"
)

// DeadRow is a dead-lettered outbox row, as an operator inspects it.
type DeadRow struct {
	ID          string    `json:"id"`
	Pipe        string    `json:"pipe"`
	Sink        string    `json:"sink"`
	DB          string    `json:"db"`
	Table       string    `json:"table"`
	Op          string    `json:"op"`
	Key         string    `json:"key"`
	Attempts    int       `json:"attempts"`
	LastError   string    `json:"last_error"`
	LastErrorAt time.Time `json:"last_error_at"`
	CommitTime  time.Time `json:"commit_ts"`
	CreatedAt   time.Time `json:"created_at"`
}

// ListDead returns up to limit dead rows (all when limit ≤ 0) of one pipe,
// or of every pipe when pipe is "", oldest first.
func ListDead(ctx context.Context, db *sql.DB, schema, pipe string, limit int) ([]DeadRow, error) {
	if err := state.CheckName(schema); err != nil {
		return nil, err
	}
	q := `SELECT id, pipe, sink, db, tbl, op, row_key, attempts, last_error, last_error_at, commit_ts, created_at
FROM ` + state.Table(schema, "outbox") + ` WHERE status = 'dead'`
	var args []any
	if pipe != "" {
		q += ` AND pipe = ?`
		args = append(args, pipe)
	}
	q += ` ORDER BY id`
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list dead rows: %w", err)
	}
	defer rows.Close()
	var out []DeadRow
	for rows.Next() {
		var (
			r           DeadRow
			lastErr     sql.NullString
			errAt, c, m sqlTime
		)
		if err := rows.Scan(&r.ID, &r.Pipe, &r.Sink, &r.DB, &r.Table, &r.Op, &r.Key, &r.Attempts, &lastErr, &errAt, &c, &m); err != nil {
			return nil, fmt.Errorf("list dead rows: %w", err)
		}
		r.LastError, r.LastErrorAt, r.CommitTime, r.CreatedAt = lastErr.String, errAt.T, c.T, m.T
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list dead rows: %w", err)
	}
	return out, nil
}

// RetryDead puts dead rows back to pending with their attempt count reset,
// due now: all dead rows, or those of one pipe, or the one with id (both
// filters may be combined). It returns how many rows were re-queued. The
// last error is kept for the record until the next attempt replaces it.
//
// A re-queued row takes its place in its key's order again: later rows of
// the same key that are still pending wait for it.
func RetryDead(ctx context.Context, db *sql.DB, schema, pipe, id string) (int64, error) {
	if err := state.CheckName(schema); err != nil {
		return 0, err
	}
	q := `UPDATE ` + state.Table(schema, "outbox") + `
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
	res, err := db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("retry dead rows: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("retry dead rows: %w", err)
	}
	return n, nil
}
