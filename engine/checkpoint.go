package engine

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/state"
)

// loadCheckpointAndClaims reads the checkpoint of source and the digest
// claims that precede it, in one snapshot, to seed the occurrence counter.
//
// Only claims created no later than the checkpoint's write count: rows of a
// huge transaction are written before its commit (without a checkpoint), and
// when the replica stops inside such a transaction it reads it again from
// the checkpoint. Seeding from those claims would give the replayed rows the
// next occurrence (a new change key) instead of the one they were written
// under, and every such row would be enqueued twice. Claims and checkpoint
// come from the database clock (NOW(6)), and a checkpoint is written after
// the claims of its own transaction, so the comparison is exact.
//
// outbox.Store.LoadCheckpointAndClaims reads every recent claim; this is
// the engine's stricter variant until the two are merged.
func loadCheckpointAndClaims(ctx context.Context, db *sql.DB, schema, source string, window time.Duration) (*binlog.Position, []string, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return nil, nil, fmt.Errorf("read checkpoint and claims: begin: %w", err)
	}
	defer tx.Rollback()
	var raw, updated string
	err = tx.QueryRowContext(ctx, "SELECT position, DATE_FORMAT(updated_at, '%Y-%m-%d %H:%i:%s.%f') FROM "+
		state.Table(schema, "checkpoints")+" WHERE source = ?", source).Scan(&raw, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, nil // no checkpoint: nothing was enqueued that a replay could meet
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read checkpoint %s: %w", source, err)
	}
	var pos binlog.Position
	if err := json.Unmarshal([]byte(raw), &pos); err != nil {
		return nil, nil, fmt.Errorf("read checkpoint %s: decode position: %w", source, err)
	}
	rows, err := tx.QueryContext(ctx, "SELECT change_key FROM "+state.Table(schema, "claims")+
		" WHERE created_at >= NOW(6) - INTERVAL ? MICROSECOND AND created_at <= ? AND change_key LIKE 'd:%' ORDER BY created_at",
		window.Microseconds(), updated)
	if err != nil {
		return nil, nil, fmt.Errorf("read recent claims: %w", err)
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, nil, fmt.Errorf("read recent claims: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read recent claims: %w", err)
	}
	return &pos, keys, tx.Commit()
}
