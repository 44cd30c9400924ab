package backfill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/cdcout/cdcout/state"
)

// Sink snapshots: the subscription each sink had when the enqueue leader
// last started (sink_subscriptions: its table patterns, the capture list
// and its ops, as JSON the engine writes and reads) and the snapshot
// backfills started (sink_tables). A table is new to a sink with
// snapshot: initial when the sink was never seen, or when its old
// subscription did not take the table; a table created under an
// unchanged subscription is not new, because the stream has carried it
// since its CREATE.

// SinkSubscription is the recorded subscription of sink (known is false
// for a sink never seen).
func SinkSubscription(ctx context.Context, db *sql.DB, schema, instance, sink string) (subscription string, known bool, err error) {
	err = db.QueryRowContext(ctx, "SELECT subscription FROM "+state.Table(schema, "sink_subscriptions")+" WHERE instance = ? AND sink = ?",
		instance, sink).Scan(&subscription)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read the subscription of sink %s: %w", sink, err)
	}
	return subscription, true, nil
}

// RecordSinkSubscription stores sink's subscription.
func RecordSinkSubscription(ctx context.Context, db *sql.DB, schema, instance, sink, subscription string) error {
	if _, err := db.ExecContext(ctx, "INSERT INTO "+state.Table(schema, "sink_subscriptions")+" (instance, sink, subscription) VALUES (?, ?, ?)"+
		" ON DUPLICATE KEY UPDATE subscription = VALUES(subscription), updated_at = NOW(6)", instance, sink, subscription); err != nil {
		return fmt.Errorf("record the subscription of sink %s: %w", sink, err)
	}
	return nil
}

// SinkTables are the tables a snapshot backfill was started for, for sink
// ("db.table").
func SinkTables(ctx context.Context, db *sql.DB, schema, instance, sink string) (map[string]bool, error) {
	tables, err := state.Strings(ctx, db, "SELECT tbl FROM "+state.Table(schema, "sink_tables")+" WHERE instance = ? AND sink = ?", instance, sink)
	if err != nil {
		return nil, fmt.Errorf("read the tables of sink %s: %w", sink, err)
	}
	out := make(map[string]bool, len(tables))
	for _, t := range tables {
		out[t] = true
	}
	return out, nil
}

// RecordSinkTable records the snapshot backfill of table for sink ("" when
// the table cannot be backfilled).
func RecordSinkTable(ctx context.Context, db *sql.DB, schema, instance, sink, table, backfill string) error {
	if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO "+state.Table(schema, "sink_tables")+" (instance, sink, tbl, backfill_id) VALUES (?, ?, ?, ?)",
		instance, sink, table, nullable(backfill)); err != nil {
		return fmt.Errorf("record table %s of sink %s: %w", table, sink, err)
	}
	return nil
}

// SourceTables lists the base tables of the source outside the system
// schemas and cdcout's own databases, as "db.table".
func SourceTables(ctx context.Context, db *sql.DB, stateSchema string) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES
		WHERE TABLE_TYPE = 'BASE TABLE' AND TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys', ?, ?)
		ORDER BY TABLE_SCHEMA, TABLE_NAME`, stateSchema, WatermarkDB(stateSchema))
	if err != nil {
		return nil, fmt.Errorf("list the source's tables: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var d, t string
		if err := rows.Scan(&d, &t); err != nil {
			return nil, fmt.Errorf("list the source's tables: %w", err)
		}
		out = append(out, d+"."+t)
	}
	return out, rows.Err()
}
