package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
)

// recordSegment marks the segment done and writes the records that left it
// as outbox rows, in one transaction, conditional on our claim: if it
// lapsed and another drainer took the segment, that drainer records it.
func (p *pipeDrainer) recordSegment(ctx context.Context, seg *segment, left []leftRecord, delivered []*segRecord) (bool, error) {
	var ok bool
	if err := p.writeOutcome(ctx, func(wctx context.Context) (err error) { ok, err = p.writeSegment(wctx, seg, left); return err }); err != nil {
		return false, fmt.Errorf("record segment %s of %s (written, or its claim taken back, on the next pass): %w", seg.id, p.name, err)
	}
	p.segmentRecorded(seg, left, delivered, ok)
	return ok, nil
}

// writeSegment is recordSegment's transaction; false when our claim
// lapsed and the segment is another drainer's.
func (p *pipeDrainer) writeSegment(ctx context.Context, seg *segment, left []leftRecord) (bool, error) {
	d := p.d
	done := `UPDATE ` + d.segments + ` SET status = 'done', next_attempt_at = NOW(6)
WHERE id = ? AND status = 'pending' AND claimer = ?`
	if len(left) == 0 {
		// Every record delivered: one statement, no transaction.
		res, err := d.cfg.DB.ExecContext(ctx, done, seg.id, d.claimer)
		if err != nil {
			return false, fmt.Errorf("mark segment done: %w", err)
		}
		n, _ := res.RowsAffected()
		return n > 0, nil
	}
	tx, err := d.cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, done, seg.id, d.claimer)
	if err != nil {
		return false, fmt.Errorf("mark segment done: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return false, nil
	}
	if err := p.insertLeft(ctx, tx, seg, left); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// segmentRecorded reports a segment's written outcome (ok), or that its
// claim had lapsed.
func (p *pipeDrainer) segmentRecorded(seg *segment, left []leftRecord, delivered []*segRecord, ok bool) {
	if !ok {
		p.log.Warn("segment claim lapsed before its outcome was written; another drainer has it",
			zap.String("segment", seg.id))
		return
	}
	commits := make([]time.Time, len(delivered))
	for i, r := range delivered {
		commits[i] = r.commitTS
	}
	var fails []failure
	for _, l := range left {
		if l.status == StatusDead || l.errText != "" {
			fails = append(fails, failure{id: l.rec.id, attempt: l.attempt, dead: l.status == StatusDead, overload: l.overload,
				delay: l.delay, errText: l.errText})
		}
	}
	p.report(commits, fails, zap.String("segment", seg.id))
}

// insertLeft writes the records that left a segment as outbox rows, and
// the attempt log of the failed ones.
func (p *pipeDrainer) insertLeft(ctx context.Context, tx *sql.Tx, seg *segment, left []leftRecord) error {
	d := p.d
	var (
		q    strings.Builder
		args []any
		log  []attemptEntry
		n    int
		size int
	)
	flush := func() error {
		if n == 0 {
			return nil
		}
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("move records of segment %s to the outbox: %w", seg.id, err)
		}
		q.Reset()
		args, n, size = args[:0], 0, 0
		return nil
	}
	for _, l := range left {
		r := l.rec
		if n > 0 && (n >= maxRowsPerStatement || size+r.size() > maxBytesPerStatement) {
			if err := flush(); err != nil {
				return err
			}
		}
		if n == 0 {
			q.WriteString("INSERT INTO " + d.outbox + " (id, pipe, sink, change_key, db, tbl, op, row_key, key_hash, commit_ts, payload," +
				" status, attempts, claimer, next_attempt_at, last_error, last_error_at) VALUES ")
		} else {
			q.WriteByte(',')
		}
		var errText, errAt any
		if l.errText != "" {
			errText, errAt = l.errText, time.Now().UTC()
		}
		// A record still being delivered is written claimed by us until
		// the claim lease ends, like a claimed row: its call's outcome
		// lands on it (finishDetached).
		claimer, delay := int64(0), l.delay
		if l.call != nil {
			claimer, delay = d.claimer, d.cfg.ClaimLease
		}
		q.WriteString("(?,?,?,?,?,?,?,?,?,?,?,?,?,?,NOW(6) + INTERVAL ? MICROSECOND,?,?)")
		args = append(args, r.id, p.name, seg.sink, r.changeKey, r.db, r.tbl, r.op, r.rowKey, r.keyHash, r.commitTS, r.payload,
			string(l.status), l.attempt, claimer, delay.Microseconds(), errText, errAt)
		n++
		size += r.size()
		if l.errText != "" && !l.overload {
			log = append(log, attemptEntry{id: r.id, n: l.attempt, errText: l.errText})
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return d.logAttempts(ctx, tx, log)
}
