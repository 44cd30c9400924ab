package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cdcout/cdcout/canonical"
)

// Barrier records: a schema-change record (canonical.OpDDL) is delivered
// in order with every record of its pipe, not only with its own key's.
// Per-key order alone would let a row written after an ALTER reach the
// sink before it, or one written before it after.
//
//   - Enqueue writes a barrier record as a segment of its own
//     (encodeSegments), so the records before it are in older segments
//     and those after it in newer ones.
//   - A pipe's segments are delivered one at a time, oldest first, and a
//     newer one is not taken while an older one is pending: the records
//     after the barrier wait until its segment is done.
//   - The barrier's segment is delivered only when the pipe has no
//     pending outbox row (every row is older than every pending segment,
//     so these are exactly the records before it that left their
//     segments: retries, records queued behind them, stalled calls), and,
//     for a RENAME, when the old name's pipe has no pending segment or
//     row older than it. Until then it is given back untouched and looked
//     at again shortly (fenceWait).
//   - Its delivery never leaves it behind as a pending row, which would
//     let newer segments pass it: a failure holds the segment whole with
//     its backoff (even for the one record), a stop gives it back, and
//     only a permanent error or the last attempt makes it a dead row,
//     which, like any dead letter, no longer holds its pipe.
//
// So the sink acknowledged every record before the barrier before the
// barrier is sent, and every record after it is sent after the barrier
// was acknowledged.

// barrierPoll is how soon a fenced segment that had to wait is looked at
// again.
const barrierPoll = 50 * time.Millisecond

// isBarrier reports whether a record must be delivered in order with its
// whole pipe.
func isBarrier(op string) bool { return op == string(canonical.OpDDL) }

// isTxRecord reports whether a record is a transaction record (BEGIN or
// END).
func isTxRecord(op string) bool { return op == string(canonical.OpTransaction) }

// barrier reports whether seg is a barrier record's segment.
func (seg *segment) barrier() bool { return len(seg.recs) == 1 && isBarrier(seg.recs[0].op) }

// TransactionPipe is the pipe of a sink's END records:
// "<instance>:__cdcout.transaction:<sink>". Versions before BeginPipe
// wrote BEGINs there too; those segments drain under the END rule
// (oldestSegment).
func TransactionPipe(instance, sink string) string {
	return PipeName(instance, canonical.HeartbeatDB, canonical.TransactionTable, sink)
}

// beginTable is the table part of BeginPipe's name; the records keep
// __cdcout.transaction as their source table.
const beginTable = canonical.TransactionTable + "_begin"

// BeginPipe is the pipe of a sink's BEGIN records:
// "<instance>:__cdcout.transaction_begin:<sink>". BEGINs have a pipe of
// their own so that they wait for nothing: in the END pipe, a BEGIN would
// queue behind the END before it, which waits for its changes, and the
// sink would get one transaction at a time.
func BeginPipe(instance, sink string) string {
	return PipeName(instance, canonical.HeartbeatDB, beginTable, sink)
}

// txPipeKind tells a sink's BEGIN pipe and END pipe from its other pipes.
func txPipeKind(pipe string) (begin, end bool) {
	_, table, _, ok := SplitPipe(pipe)
	if !ok {
		return false, false
	}
	return table == canonical.HeartbeatDB+"."+beginTable, table == canonical.HeartbeatDB+"."+canonical.TransactionTable
}

// txRecords reports whether seg holds transaction records.
func (seg *segment) txRecords() bool {
	return len(seg.recs) > 0 && isTxRecord(seg.recs[0].op)
}

// fenced reports whether seg is held whole rather than left in part as
// rows: a barrier, or transaction records (a BEGIN or END left as a row
// would let the newer ones of its pipe pass it).
func (seg *segment) fenced() bool { return seg.barrier() || seg.txRecords() }

// errWaits: the pipe's oldest segment waits for older records of the
// sink's other pipes (oldestSegment); it was not claimed.
var errWaits = errors.New("segment waits for older records of its sink")

// oldestSegment returns the id of the pipe's oldest pending segment ("":
// none) and whether it must wait before it is claimed, for the order of
// a sink's transaction records with its changes (docs/ARCHITECTURE.md,
// "Transaction metadata"):
//
//   - a segment of the BEGIN pipe waits for nothing;
//   - a segment of a data pipe of a sink with transactions waits until
//     the sink's BEGIN pipe has no pending segment or row older than its
//     last record: the BEGIN of every transaction it holds changes of was
//     acknowledged. A row that leaves the segment later needs no wait of
//     its own;
//   - a segment of the END pipe waits the same for the BEGIN pipe (BEGIN
//     T before END T even when none of T's changes is pending), and until
//     the pipes of the tables its ENDs count have no pending segment or
//     row older than its last record: an END reaches the sink after every
//     change of its transaction. An END that counts no table, or a record
//     that does not parse, waits for every record of the sink's other
//     pipes older than the last (sinkPendingBefore).
//
// Every wait goes BEGIN → nothing, change → BEGIN, END → BEGIN and
// change, so none closes a cycle. The BEGIN wait is read with the
// segment, in one statement. While it reads, the pipe is marked waiting:
// an acknowledgement in another pipe of the sink in this process wakes it
// (Wakes).
func (p *pipeDrainer) oldestSegment(ctx context.Context) (id string, wait, more bool, err error) {
	d := p.d
	// A pipe without waits reads only the fifo index, and whether a newer
	// segment is pending too (readAhead); the END pipe also its segment's
	// last record and payload (a few small records).
	cols, args := "s.id, s.id, NULL, FALSE, "+newerPendingSQL(d.segments), []any{}
	switch {
	case p.endRecords:
		cols = "s.id, s.last_id, s.payload, " + pendingSQL(d.segments, d.outbox, "s.last_id") + ", FALSE"
		args = append(args, p.beginPipe, p.beginPipe)
	case p.beginPipe != "":
		cols = "s.id, s.id, NULL, " + pendingSQL(d.segments, d.outbox, "s.last_id") + ", FALSE"
		args = append(args, p.beginPipe, p.beginPipe)
	}
	if p.beginPipe != "" {
		p.waiting.Store(true)
		defer func() { p.waiting.Store(id != "" && (wait || err != nil)) }()
	}
	var (
		last    string
		payload []byte
	)
	err = d.cfg.DB.QueryRowContext(ctx, `SELECT `+cols+` FROM `+d.segments+` s
WHERE s.pipe = ? AND s.status = 'pending' ORDER BY s.id LIMIT 1`, append(args, p.name)...).Scan(&id, &last, &payload, &wait, &more)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, false, nil
	}
	if err != nil {
		return "", false, false, fmt.Errorf("claim segment of %s: %w", p.name, err)
	}
	if p.endRecords && !wait {
		wait, err = p.endWait(ctx, last, payload)
	}
	return id, wait, more, err
}

// newerPendingSQL is a column: whether the pipe has a pending segment
// newer than s (one probe of the fifo index).
func newerPendingSQL(segments string) string {
	return `EXISTS (SELECT 1 FROM ` + segments + ` n WHERE n.pipe = s.pipe AND n.status = 'pending' AND n.id > s.id)`
}

// endWait reports whether a segment of the END pipe (its last record
// last) waits for the changes its ENDs count (oldestSegment). BEGINs in
// it (written by versions before BeginPipe) count nothing.
func (p *pipeDrainer) endWait(ctx context.Context, last string, payload []byte) (bool, error) {
	tables, wide := endTables(payload)
	if wide {
		return p.d.sinkPendingBefore(ctx, p.name, last)
	}
	if len(tables) == 0 {
		return false, nil // BEGINs only
	}
	instance, _, sink, _ := SplitPipe(p.name)
	var q strings.Builder
	q.WriteString("SELECT ")
	var args []any
	for i, t := range tables {
		if i > 0 {
			q.WriteString(" OR ")
		}
		q.WriteString(pendingSQL(p.d.segments, p.d.outbox, "?"))
		pipe := instance + ":" + t + ":" + sink
		args = append(args, pipe, last, pipe, last)
	}
	var wait bool
	if err := p.d.cfg.DB.QueryRowContext(ctx, q.String(), args...).Scan(&wait); err != nil {
		return false, fmt.Errorf("pending changes before %s of %s: %w", last, p.name, err)
	}
	return wait, nil
}

// pendingSQL is a condition, true when a pipe (the first and third
// argument) has a pending segment or row older than before (a column or
// the second and fourth argument). One statement is one read view
// (autocommit at the pool's REPEATABLE READ), so a segment recorded
// meanwhile cannot hide a record that left it as a row from both reads.
func pendingSQL(segments, outbox, before string) string {
	return `EXISTS (SELECT 1 FROM ` + segments + ` t WHERE t.pipe = ? AND t.status = 'pending' AND t.id < ` + before +
		`) OR EXISTS (SELECT 1 FROM ` + outbox + ` o FORCE INDEX (due) WHERE o.pipe = ? AND o.status = 'pending' AND o.id < ` + before + `)`
}

// endTables returns the tables ("db.table") the ENDs of a segment of
// transaction records count, in first appearance order; wide when an END
// counts none or a record is no transaction record that parses.
func endTables(payload []byte) (tables []string, wide bool) {
	recs, err := parseSegment(payload)
	if err != nil {
		return nil, true
	}
	seen := map[string]bool{}
	for _, r := range recs {
		var env struct {
			Tx *struct {
				Status          string `json:"status"`
				DataCollections []struct {
					Name string `json:"data_collection"`
				} `json:"data_collections"`
			} `json:"tx"`
		}
		if err := json.Unmarshal(r.payload, &env); err != nil || env.Tx == nil {
			return nil, true
		}
		switch env.Tx.Status {
		case canonical.TxBegin:
			continue
		case canonical.TxEnd:
			if len(env.Tx.DataCollections) == 0 {
				return nil, true
			}
		default:
			return nil, true
		}
		for _, dc := range env.Tx.DataCollections {
			if !seen[dc.Name] {
				seen[dc.Name] = true
				tables = append(tables, dc.Name)
			}
		}
	}
	return tables, false
}

// fenceWait reports whether the barrier segment seg must wait for earlier
// records: pending outbox rows of its pipe, and, for a RENAME, pending
// segments and rows of the old name's pipe older than it.
func (p *pipeDrainer) fenceWait(ctx context.Context, seg *segment) (bool, error) {
	p.waiting.Store(true)
	wait, err := p.barrierWait(ctx, seg)
	p.waiting.Store(wait || err != nil)
	return wait, err
}

func (p *pipeDrainer) barrierWait(ctx context.Context, seg *segment) (bool, error) {
	if wait, err := p.d.pendingBefore(ctx, p.name, ""); wait || err != nil {
		return wait, err
	}
	old, err := renamedFrom(p.name, seg.recs[0].payload)
	if err != nil || old == "" || old == p.name {
		return false, err
	}
	return p.d.pendingBefore(ctx, old, seg.id)
}

// sinkPendingBefore reports whether any other pipe of pipe's instance and
// sink has a pending segment or row older than before. The pipes with
// pending records are read each time (a pipe first written by the
// transaction itself must count), then each is probed.
func (d *Drainer) sinkPendingBefore(ctx context.Context, pipe, before string) (bool, error) {
	instance, _, sink, ok := SplitPipe(pipe)
	if !ok {
		return false, nil
	}
	pipes, err := NewStore(d.cfg.DB, d.cfg.Schema, nil).PipesWithRecords(ctx, instance+":", StatusPending)
	if err != nil {
		return false, fmt.Errorf("pipes of %s: %w", sink, err)
	}
	seen := map[string]bool{pipe: true}
	for _, p := range pipes {
		if seen[p] {
			continue
		}
		seen[p] = true
		if in, _, s, ok := SplitPipe(p); !ok || in != instance || s != sink {
			continue
		}
		if wait, err := d.pendingBefore(ctx, p, before); wait || err != nil {
			return wait, err
		}
	}
	return false, nil
}

// pendingBefore reports whether pipe has a pending outbox row (with an id
// below before, when set) or, with before set, a pending segment older
// than before, both in one statement (pendingSQL: one read view, so a
// segment done meanwhile cannot hide the rows that left it).
func (d *Drainer) pendingBefore(ctx context.Context, pipe, before string) (bool, error) {
	if before == "" {
		return d.pendingRow(ctx, pipe)
	}
	var wait bool
	if err := d.cfg.DB.QueryRowContext(ctx, `SELECT `+pendingSQL(d.segments, d.outbox, "?"), pipe, before, pipe, before).Scan(&wait); err != nil {
		return false, fmt.Errorf("pending records of %s before %s: %w", pipe, before, err)
	}
	return wait, nil
}

// pendingRow reports whether pipe has a pending outbox row.
func (d *Drainer) pendingRow(ctx context.Context, pipe string) (bool, error) {
	var one int
	err := d.cfg.DB.QueryRowContext(ctx, `SELECT 1 FROM `+d.outbox+` FORCE INDEX (due) WHERE pipe = ? AND status = 'pending' LIMIT 1`, pipe).Scan(&one)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("pending rows of %s: %w", pipe, err)
	}
	return false, nil
}

// renamedFrom returns the pipe of the old name of a RENAME record in pipe
// (same instance and sink), "" for any other record.
func renamedFrom(pipe string, envelope []byte) (string, error) {
	var env struct {
		DDL *struct {
			OldDB    string `json:"old_db"`
			OldTable string `json:"old_table"`
		} `json:"ddl"`
	}
	if err := json.Unmarshal(envelope, &env); err != nil {
		return "", fmt.Errorf("schema-change record of %s: %w", pipe, err)
	}
	if env.DDL == nil || env.DDL.OldTable == "" {
		return "", nil
	}
	instance, _, sink, ok := SplitPipe(pipe)
	if !ok {
		return "", nil
	}
	return PipeName(instance, env.DDL.OldDB, env.DDL.OldTable, sink), nil
}
