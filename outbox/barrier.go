package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/state"
)

// Barrier records: a schema-change record (canonical.OpDDL) is delivered
// in order with every record of its pipe, not only with its own key's.
// Per-key order alone would let a row written after an ALTER reach the
// sink before it, or one written before it after.
//
//   - Enqueue writes a barrier record as a segment of its own
//     (insertSegments), so the records before it are in older segments
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

// barrier reports whether seg is a barrier record's segment.
func (seg *segment) barrier() bool { return len(seg.recs) == 1 && isBarrier(seg.recs[0].op) }

// txRecords reports whether seg holds transaction records (the pipe of a
// sink's BEGIN and END records).
func (seg *segment) txRecords() bool {
	return len(seg.recs) > 0 && seg.recs[0].op == string(canonical.OpTransaction)
}

// fenced reports whether seg waits for records of other pipes or of its
// whole pipe before it is delivered, and is held whole rather than left
// in part as rows.
func (seg *segment) fenced() bool { return seg.barrier() || seg.txRecords() }

// fenceWait reports whether the fenced segment seg must wait for earlier
// records. A barrier waits for pending outbox rows of its pipe, and, for
// a RENAME, pending segments and rows of the old name's pipe older than
// it. Transaction records wait for every record of the sink's other pipes
// older than the segment's last one: an END reaches the sink after every
// change of its transaction (docs/ARCHITECTURE.md, "Transaction
// metadata").
func (p *pipeDrainer) fenceWait(ctx context.Context, seg *segment) (bool, error) {
	if seg.txRecords() {
		return p.d.sinkPendingBefore(ctx, p.name, seg.recs[len(seg.recs)-1].id)
	}
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
	// The pipes with pending records, as PipesWithRecords reads them.
	pipes, err := state.Strings(ctx, d.cfg.DB, `SELECT DISTINCT pipe FROM `+d.outbox+` WHERE pipe LIKE ? AND status = 'pending'`+
		` UNION SELECT DISTINCT pipe FROM `+d.segments+` WHERE pipe LIKE ? AND status = 'pending'`,
		state.LikePrefix(instance+":"), state.LikePrefix(instance+":"))
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
// than before. Segments are read first: a segment becomes done in the
// transaction that inserts its records that left it as rows, so a segment
// seen done has its rows visible to the read that follows, while the
// other order could miss both (done after the rows were read).
func (d *Drainer) pendingBefore(ctx context.Context, pipe, before string) (bool, error) {
	var one int
	if before != "" {
		err := d.cfg.DB.QueryRowContext(ctx, `SELECT 1 FROM `+d.segments+` WHERE pipe = ? AND status = 'pending' AND id < ? LIMIT 1`,
			pipe, before).Scan(&one)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return false, fmt.Errorf("pending segments of %s: %w", pipe, err)
		}
	}
	q := `SELECT 1 FROM ` + d.outbox + ` FORCE INDEX (due) WHERE pipe = ? AND status = 'pending'`
	args := []any{pipe}
	if before != "" {
		q += ` AND id < ?`
		args = append(args, before)
	}
	err := d.cfg.DB.QueryRowContext(ctx, q+` LIMIT 1`, args...).Scan(&one)
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
