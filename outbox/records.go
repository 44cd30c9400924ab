package outbox

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/cdcout/cdcout/state"
)

// StoredRecord is one record of the outbox as a whole: a row of the outbox
// table, or a record still inside its segment.
type StoredRecord struct {
	ID, Pipe, Sink, ChangeKey, DB, Table, Op, Key string
	// Status is pending, delivered or dead. A record of a done segment
	// that has no row of its own was delivered.
	Status  Status
	Payload []byte
	// InSegment is the id of the segment holding the record, "" for a row.
	InSegment string
}

// ReadRecords returns every record of the state database schema whose pipe
// is LIKE pipeLike ("%" for all), rows and segment records alike, each
// once, in id order within rows and then segments. A record that left its
// segment is reported as its row. It reads everything into memory: for
// tests, tools and checks on small outboxes, not for the hot path.
func ReadRecords(ctx context.Context, db *sql.DB, schema, pipeLike string) ([]StoredRecord, error) {
	if err := state.CheckName(schema); err != nil {
		return nil, err
	}
	var out []StoredRecord
	seen := map[string]bool{}
	rows, err := db.QueryContext(ctx, `SELECT id, pipe, sink, change_key, db, tbl, op, row_key, status, payload
FROM `+state.Table(schema, "outbox")+` WHERE pipe LIKE ? ORDER BY id`, pipeLike)
	if err != nil {
		return nil, fmt.Errorf("read outbox rows: %w", err)
	}
	for rows.Next() {
		var r StoredRecord
		if err := rows.Scan(&r.ID, &r.Pipe, &r.Sink, &r.ChangeKey, &r.DB, &r.Table, &r.Op, &r.Key, &r.Status, &r.Payload); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read outbox rows: %w", err)
		}
		seen[r.ID] = true
		out = append(out, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read outbox rows: %w", err)
	}
	segs, err := db.QueryContext(ctx, `SELECT id, pipe, sink, status, payload
FROM `+state.Table(schema, "segments")+` WHERE pipe LIKE ? ORDER BY id`, pipeLike)
	if err != nil {
		return nil, fmt.Errorf("read outbox segments: %w", err)
	}
	defer segs.Close()
	for segs.Next() {
		var id, pipe, sink string
		var status Status
		var payload []byte
		if err := segs.Scan(&id, &pipe, &sink, &status, &payload); err != nil {
			return nil, fmt.Errorf("read outbox segments: %w", err)
		}
		recs, err := parseSegment(payload)
		if err != nil {
			return nil, fmt.Errorf("segment %s: %w", id, err)
		}
		st := StatusPending
		if status == StatusDone {
			st = StatusDelivered
		}
		for _, r := range recs {
			if seen[r.id] {
				continue
			}
			out = append(out, StoredRecord{ID: r.id, Pipe: pipe, Sink: sink, ChangeKey: r.changeKey, DB: r.db, Table: r.tbl,
				Op: r.op, Key: r.rowKey, Status: st, Payload: r.payload, InSegment: id})
		}
	}
	return out, segs.Err()
}
