// Package control keeps the operator's per-sink controls — pause and
// resume — in the state database, where every replica of an instance
// reads them. A paused sink's pipes are not claimed by any replica's
// drainer; enqueue goes on writing their records, which wait (retention
// deletes only delivered and dead ones) until the sink is resumed.
package control

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/cdcout/cdcout/state"
)

// SinkState is one sink's control row.
type SinkState struct {
	Sink   string `json:"sink"`
	Paused bool   `json:"paused"`
	// ChangedBy says who paused or resumed it last ("cli", "api", …).
	ChangedBy string    `json:"changedBy,omitempty"`
	ChangedAt time.Time `json:"changedAt,omitzero"`
}

// SetPaused pauses (paused true) or resumes sink in instance, recording
// by. It reports whether that changed anything (false: already so).
func SetPaused(ctx context.Context, db *sql.DB, schema, instance, sink string, paused bool, by string) (bool, error) {
	if err := state.CheckName(schema); err != nil {
		return false, err
	}
	verb := "resume"
	if paused {
		verb = "pause"
	}
	// Affected rows: 1 inserted, 2 updated, 0 unchanged (MySQL's
	// INSERT … ON DUPLICATE KEY UPDATE without CLIENT_FOUND_ROWS).
	res, err := db.ExecContext(ctx, `INSERT INTO `+state.Table(schema, "sink_controls")+` (instance, sink, paused, changed_by, changed_at)
VALUES (?, ?, ?, ?, NOW(6))
ON DUPLICATE KEY UPDATE changed_by = IF(paused = VALUES(paused), changed_by, VALUES(changed_by)),
  changed_at = IF(paused = VALUES(paused), changed_at, VALUES(changed_at)), paused = VALUES(paused)`, instance, sink, paused, by)
	if err != nil {
		return false, fmt.Errorf("%s sink %s: %w", verb, sink, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("%s sink %s: %w", verb, sink, err)
	}
	// A first row that resumes a never-paused sink changes nothing.
	return n == 2 || (n == 1 && paused), nil
}

// List returns the control rows of instance, by sink name.
func List(ctx context.Context, db *sql.DB, schema, instance string) ([]SinkState, error) {
	if err := state.CheckName(schema); err != nil {
		return nil, err
	}
	out, err := state.Collect(ctx, db, `SELECT sink, paused, changed_by, changed_at FROM `+state.Table(schema, "sink_controls")+`
WHERE instance = ? ORDER BY sink`, []any{instance}, func(rows *sql.Rows) (SinkState, error) {
		var (
			s  SinkState
			at state.Time
		)
		err := rows.Scan(&s.Sink, &s.Paused, &s.ChangedBy, &at)
		s.ChangedAt = at.T
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("read sink controls: %w", err)
	}
	return out, nil
}

// Paused returns the names of instance's paused sinks.
func Paused(ctx context.Context, db *sql.DB, schema, instance string) (map[string]bool, error) {
	states, err := List(ctx, db, schema, instance)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, s := range states {
		if s.Paused {
			out[s.Sink] = true
		}
	}
	return out, nil
}
