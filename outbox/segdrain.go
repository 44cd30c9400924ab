package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/state"
)

// Segments are the fast path of delivery; outbox rows the slow one.
//
// A pipe's segments are delivered oldest first, one at a time, by whoever
// claims the oldest pending segment (claims lapse and are fenced like row
// claims). Within a segment, records of different keys go out
// concurrently, a key's records in order. A record leaves its segment and
// becomes an outbox row when
//
//   - its key has a pending outbox row (an earlier record of the key is
//     being retried there: the later ones queue behind it),
//   - it fails (the row carries the attempt and is retried with backoff or
//     dead-lettered, as any row), or an earlier record of its key in the
//     segment failed,
//   - the delivery of the segment stops early (shutdown, lost lease, half
//     the claim lease spent): the rest is handed to the row drainer.
//
// Except in an outage: when the first record of every key fails (two
// keys at least), every failure retryable, the segment is not taken
// apart but waits out a backoff whole (held) and is tried again, so a sink
// that is down costs one update per segment attempt instead of a row per
// record. After MaxAttempts it is taken apart as above (its records dead).
//
// The segment is then done, in the transaction that inserts those rows, so
// no record is lost or written twice. Per-key order holds because every
// outbox row is older than the oldest pending segment: rows come only from
// segments that are done.

// rowsFromKeptSegments counts, per (pipe, status) group of outbox rows o
// restricted by in (a "pipe IN (…)" condition, its arguments given once
// for the join and once for the outer WHERE), the rows that left a done
// segment still kept: a done segment's records were delivered except
// those, which count in their row's status instead (Store.Backlogs). They
// are the rows whose id is at or above the pipe's oldest done segment's
// id, by the ordering rule above: rows are only ever written from done
// segments (or before segments existed, with older ids), a pipe's segments
// are done in id order and deleted by retention in that order, and a
// row's id is its record's id in the segment. So the count is exact unless
// ids of a pipe's segments interleave (two leaders enqueueing at once, each
// with its own clock), where delivered is off by the rows concerned. The
// derived table is one probe of the fifo index per pipe (MIN(id) of a
// (pipe, status) prefix); the count stays a scan of the due index.
func rowsFromKeptSegments(segments, in string) (count, join string) {
	return `COALESCE(SUM(o.id >= s.first), 0)`, `LEFT JOIN (
  SELECT pipe, MIN(id) AS first FROM ` + segments + ` WHERE ` + in + ` AND status = 'done' GROUP BY pipe
) s ON s.pipe = o.pipe`
}

// segment is one claimed segment.
type segment struct {
	id        string
	sink      string
	attempt   int
	recs      []segRecord
	claimedAt time.Time
	// rowsPending: the pipe had pending outbox rows when the segment was
	// read, so their keys are looked up (openKeys); usually it has none.
	rowsPending bool
	// more: a newer segment of the pipe was pending when this one was
	// found, so the next is read while this one is delivered (readAhead).
	more bool
	// Of a segment read ahead: when, and under which drain lease epoch.
	readAt    time.Time
	readEpoch uint64
}

// leftRecord is a record that leaves its segment as an outbox row.
type leftRecord struct {
	rec     *segRecord
	attempt int    // attempts the row starts with: 0 for records not tried
	status  Status // pending or dead
	delay   time.Duration
	errText string
	// overload: the receiver was at capacity; not an attempt (none is
	// logged, and attempt is the count before this claim).
	overload bool
	// call is set for a record still being delivered when its segment
	// is recorded (a stalled call, see segRun.next): its row is
	// written claimed by us, and the call's outcome is recorded on it.
	call *detachedCall
}

// detachedCall is a Deliver call the segment did not wait for.
type detachedCall struct {
	recs  []Record
	start time.Time
	done  chan []error // the call's errors, once
}

// drainSegment claims the pipe's oldest pending segment, delivers it and
// records the outcome. n is the number of records the segment held (sent,
// or moved to rows); 0 with a nil error means there was no segment to take.
func (p *pipeDrainer) drainSegment(ctx context.Context) (int, error) {
	if err := p.takeBack(ctx); err != nil {
		return 0, err
	}
	seg, err := p.claimSegment(ctx)
	if errors.Is(err, errWaits) {
		p.retryDueIn(p.d.segmentPoll) // or woken sooner (Wakes)
		return 0, nil
	}
	if err != nil || seg == nil {
		return 0, err
	}
	// From the claim on, the segment is finished even during a stop: what
	// is not delivered by then leaves it as outbox rows.
	wctx := context.WithoutCancel(ctx)
	if seg.barrier() {
		wait, err := p.fenceWait(wctx, seg)
		if err != nil || wait {
			// Untouched: given back with its attempt, looked at again soon.
			p.releaseSegment(wctx, seg.id)
			p.retryDueIn(p.d.segmentPoll)
			return 0, err
		}
	}
	ahead := p.readAhead(wctx, seg)
	clean := false
	defer func() { p.keepAhead(ahead, clean) }()
	var blocked map[string]bool
	if seg.rowsPending {
		if blocked, err = p.openKeys(wctx); err != nil {
			p.releaseSegment(wctx, seg.id)
			return 0, fmt.Errorf("segment %s of %s: read keys with pending rows: %w", seg.id, p.name, err)
		}
	}
	left, delivered, hold := p.deliverSegment(ctx, seg, blocked)
	if hold != nil {
		if err := p.holdSegment(wctx, seg, hold); err != nil {
			// The hold still applies: the claim is taken back when it ends.
			p.setStuck(&stuckClaim{id: seg.id, notBefore: time.Now().Add(hold.delay)})
			return len(seg.recs), err
		}
		return len(seg.recs), nil
	}
	if seg.fenced() {
		// A fenced segment leaves no pending row (it would be delivered
		// without the fence, and newer segments would pass a barrier): a
		// retryable failure holds it whole, records not sent give it back
		// (those delivered go again, under their ids). Only a dead record
		// lets the rest leave as rows, or the segment would fail forever.
		if i := slices.IndexFunc(left, func(l leftRecord) bool { return l.status == StatusPending && l.errText != "" }); i >= 0 {
			h := &segmentHold{tried: 1, delay: left[i].delay, errText: left[i].errText, overload: left[i].overload}
			if err := p.holdSegment(wctx, seg, h); err != nil {
				p.setStuck(&stuckClaim{id: seg.id, notBefore: time.Now().Add(h.delay)})
				return len(seg.recs), err
			}
			return len(seg.recs), nil
		}
		dead := slices.ContainsFunc(left, func(l leftRecord) bool { return l.status == StatusDead })
		if !dead && slices.ContainsFunc(left, func(l leftRecord) bool { return l.status == StatusPending }) {
			p.releaseSegment(wctx, seg.id)
			return 0, nil
		}
	}
	recorded := false
	defer func() { p.finishDetached(wctx, left, recorded) }()
	if len(delivered) == 0 && untried(left) && (ctx.Err() != nil || !p.leaseHeld()) {
		// Stopped before anything was sent: the segment stays as it was.
		// (A segment whose keys are all blocked is not released: it would
		// hold up every later segment; its records queue as rows.)
		p.releaseSegment(wctx, seg.id)
		return 0, nil
	}
	ok, err := p.recordSegment(wctx, seg, left, delivered)
	if err != nil {
		// The outcome is known: the next pass writes it rather than send
		// the segment again. Not when a call of it is still under way (its
		// outcome would have no row to land on): then the claim is taken
		// back and the segment delivered again under the same ids, the
		// attempt counted.
		c := &stuckClaim{id: seg.id, keepAttempt: true}
		if !detached(left) {
			c.outcome = &segOutcome{seg: seg, left: left, delivered: delivered}
		}
		p.setStuck(c)
		return len(seg.recs), err
	}
	recorded = ok
	if len(left) > 0 {
		p.poke() // rows for the row drainer
	}
	clean = ok && len(left) == 0
	return len(seg.recs), nil
}

// Reading ahead. Finding, claiming and reading a segment took a third of
// the segment loop's time on a backlog (three round trips and the parse,
// 3.5 of 11.3 ms a segment to the file sink, the database on the same
// two cores), all of it while nothing was delivered. So while a segment is
// delivered, the pipe's next one is read and parsed beside it (when one
// was pending: more), without claiming it. It is used only when the
// segment before it ended cleanly, every record delivered and the segment
// recorded done with our claim: then it is the pipe's oldest pending
// segment, and no record of the one before left a row, so what it read of
// the pipe's pending rows still holds (rows leave segments only from their
// own delivery, ours). Its claim then checks, in the one UPDATE, that it
// is still pending and due and that its attempts are those it read, so
// nobody claimed it in between; if not, the loop finds, claims and reads
// as before. What was read is trusted for aheadMaxAge, and only under the
// drain lease epoch it was read under. Anything else (a hold, a record
// left as a row, a release, an error) drops what was read: it was never
// claimed, so there is nothing to give back. Pipes whose segments wait for other pipes' records (sinks
// with transactions) do not read ahead: their waits are decided per
// segment (oldestSegment).

// aheadMaxAge bounds how long what was read ahead is trusted, and only
// under the drain lease epoch it was read under: what it says of the
// pipe's pending rows holds only while no other drainer delivered the
// pipe's segments since (a drainer that lost its lease, and took it back
// after another had delivered segments that left rows, would otherwise
// send a key's newer record ahead of its older row). The next pass
// usually comes within milliseconds.
const aheadMaxAge = time.Second

// readAhead starts reading seg's successor when there is one to read; the
// channel yields it (nil when there was none or reading failed: the loop
// then finds it the usual way).
func (p *pipeDrainer) readAhead(ctx context.Context, seg *segment) <-chan *segment {
	if !seg.more || p.endRecords || p.beginPipe != "" {
		return nil
	}
	l, _, err := p.drainLease()
	if err != nil {
		return nil
	}
	ch := make(chan *segment, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, p.d.stmtTimeout)
		defer cancel()
		at := time.Now()
		next, err := p.readNext(rctx, seg.id)
		if err != nil {
			p.log.Debug("read ahead", zap.String("after", seg.id), zap.Error(err))
		}
		if next != nil {
			next.readAt, next.readEpoch = at, l.Epoch
		}
		ch <- next
	}()
	return ch
}

// keepAhead waits for the read ahead, if one was started, and keeps what
// it read for the next pass when the segment before ended cleanly.
func (p *pipeDrainer) keepAhead(ahead <-chan *segment, clean bool) {
	if ahead == nil {
		return
	}
	if next := <-ahead; clean {
		p.ahead = next
	}
}

// readNext reads and parses the pipe's oldest pending segment after id,
// without claiming it; nil with any error (a segment found whose payload
// was not read has no records: claimed as read, it would be marked done
// with nothing sent).
func (p *pipeDrainer) readNext(ctx context.Context, after string) (*segment, error) {
	d := p.d
	// With the payload of the segment most likely next kept, it is left
	// out (an expression of it would still have the server read its
	// pages), and read after all if the segment is another.
	kept := d.cfg.Recent.next(p.name, after)
	payload := ", s.payload"
	if kept != nil {
		payload = ""
	}
	rows, err := d.cfg.DB.QueryContext(ctx, `SELECT s.id, s.sink, s.attempts, EXISTS (SELECT 1 FROM `+d.outbox+` FORCE INDEX (due)
WHERE pipe = s.pipe AND status = 'pending'), `+newerPendingSQL(d.segments)+payload+` FROM `+d.segments+` s
WHERE s.pipe = ? AND s.status = 'pending' AND s.id > ? ORDER BY s.id LIMIT 1`, p.name, after)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		return nil, rows.Err()
	}
	seg := &segment{}
	dest := []any{&seg.id, &seg.sink, &seg.attempt, &seg.rowsPending, &seg.more}
	var raw sql.RawBytes
	if kept == nil {
		dest = append(dest, &raw)
	}
	if err := rows.Scan(dest...); err != nil {
		return nil, err
	}
	if kept != nil && kept.id == seg.id {
		if seg.recs, err = d.parseKept(kept); err != nil {
			return nil, err
		}
	} else if kept != nil {
		if err := rows.Close(); err != nil {
			return nil, err
		}
		if err := d.readPayload(ctx, seg); err != nil {
			return nil, err
		}
	} else if seg.recs, err = parsePayload(raw); err != nil {
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	return seg, nil
}

// readPayload reads and parses seg's payload alone.
func (d *Drainer) readPayload(ctx context.Context, seg *segment) error {
	rows, err := d.cfg.DB.QueryContext(ctx, `SELECT payload FROM `+d.segments+` WHERE id = ?`, seg.id)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	var raw sql.RawBytes
	if err := rows.Scan(&raw); err != nil {
		return err
	}
	if seg.recs, err = parsePayload(raw); err != nil {
		return err
	}
	return rows.Close()
}

// parseKept parses a kept segment's payload, which is then no longer
// kept.
func (d *Drainer) parseKept(kept *recentSegment) ([]segRecord, error) {
	recs, err := parseSegment(kept.payload)
	if err == nil {
		d.cfg.Recent.took(kept)
	}
	return recs, err
}

// claimAhead claims the segment read ahead, if it is still as it was read:
// pending, due, and not claimed by anyone since (its attempts unchanged).
// It returns nil when it is not.
func (p *pipeDrainer) claimAhead(ctx context.Context, l lease.Lease, fenced bool, seg *segment) (*segment, error) {
	d := p.d
	q, args := d.claimUpdate(l, fenced, d.segments+` s`,
		`s.claimer = ?, s.next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND, s.attempts = s.attempts + 1`,
		`s.id = ? AND s.status = 'pending' AND s.next_attempt_at <= NOW(6) AND s.attempts = ?`, []any{seg.id, seg.attempt})
	res, err := d.cfg.DB.ExecContext(ctx, q, args...)
	if err != nil {
		p.releaseSegment(ctx, seg.id)
		return nil, fmt.Errorf("claim segment %s of %s: %w", seg.id, p.name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, nil
	}
	seg.attempt++
	seg.claimedAt = time.Now()
	d.claimedAhead.Add(1)
	return seg, nil
}

// finishDetached records the outcome of each call the segment did not
// wait for on its row, in the background, once the call returns; when the
// segment was not recorded (its claim lapsed, or writing failed) there is
// no row, and whoever delivers the segment again sends the record again
// under the same id.
func (p *pipeDrainer) finishDetached(ctx context.Context, left []leftRecord, recorded bool) {
	seen := map[*detachedCall]bool{}
	for _, l := range left {
		c := l.call
		if c == nil || seen[c] {
			continue
		}
		seen[c] = true
		p.bg.Add(1)
		go func() {
			defer p.bg.Done()
			errs := <-c.done
			if !recorded {
				return
			}
			if err := p.record(ctx, c.recs, errs, time.Since(c.start)); err != nil {
				p.log.Error("record outcome of a stalled delivery", zap.Error(err))
			}
			p.poke() // the key's later rows may go now
		}()
	}
}

// untried reports whether no record of left was sent.
func untried(left []leftRecord) bool {
	for _, l := range left {
		if l.errText != "" {
			return false
		}
	}
	return true
}

// claimSegment claims the oldest pending segment of the pipe, if it is due
// (unclaimed, or its claim lapsed) and need not wait for other pipes'
// records (oldestSegment; errWaits). Segments are delivered strictly in
// order, so a newer one is never taken while an older one is claimed.
func (p *pipeDrainer) claimSegment(ctx context.Context) (*segment, error) {
	d := p.d
	l, fenced, err := p.drainLease()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	// What was read ahead serves this claim or none: too old to trust,
	// or read under another lease, it is dropped.
	ahead := p.ahead
	p.ahead = nil
	if ahead != nil && ahead.readEpoch == l.Epoch && time.Since(ahead.readAt) < aheadMaxAge {
		if seg, err := p.claimAhead(cctx, l, fenced, ahead); seg != nil || err != nil {
			return seg, err
		}
	}
	id, wait, more, err := p.oldestSegment(ctx)
	if err != nil || id == "" {
		return nil, err
	}
	if wait {
		return nil, fmt.Errorf("segment %s of %s: %w", id, p.name, errWaits)
	}
	// Due: unclaimed and not held (next_attempt_at is its creation or
	// release), a lapsed claim, or a hold that ended; or claimed by us and
	// in nobody's hands, unless it is our stuck claim (a hold whose
	// release failed waits for its end). Only this pass claims the pipe's
	// segments with our claimer, and it holds none while it claims, so
	// such a claim is a leftover: a claim whose answer was lost and whose
	// release ran before the server ran the claim (a reset connection's
	// statement still under way there). Left to lapse, it held the pipe
	// for the claim lease.
	due, where := `s.next_attempt_at <= NOW(6)`, []any{id}
	if !p.stuckOn(id) {
		due, where = `(s.next_attempt_at <= NOW(6) OR s.claimer = ?)`, append(where, d.claimer)
	}
	q, args := d.claimUpdate(l, fenced, d.segments+` s`,
		`s.claimer = ?, s.next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND, s.attempts = s.attempts + 1`,
		`s.id = ? AND s.status = 'pending' AND `+due, where)
	res, err := d.cfg.DB.ExecContext(cctx, q, args...)
	if err != nil {
		p.releaseSegment(cctx, id)
		return nil, fmt.Errorf("claim segment %s of %s: %w", id, p.name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, nil // claimed by another drainer, or our lease is gone
	}
	seg := &segment{id: id, claimedAt: time.Now(), more: more}
	if seg.recs, err = p.readSegment(cctx, seg); err != nil {
		p.releaseSegment(cctx, id)
		return nil, fmt.Errorf("read segment %s of %s: %w", id, p.name, err)
	}
	return seg, nil
}

// readSegment reads and parses a claimed segment. The payload is parsed
// from the driver's buffer (sql.RawBytes) rather than a copy of it: a
// wide record's segment would otherwise be held three times at once
// (packet, copy, decompressed).
func (p *pipeDrainer) readSegment(ctx context.Context, seg *segment) ([]segRecord, error) {
	d := p.d
	kept := d.cfg.Recent.get(p.name, seg.id)
	payload := ", payload"
	if kept != nil {
		payload = "" // kept in memory (Recent)
	}
	rows, err := d.cfg.DB.QueryContext(ctx, `SELECT sink, attempts, EXISTS (SELECT 1 FROM `+d.outbox+` FORCE INDEX (due)
WHERE pipe = ? AND status = 'pending')`+payload+` FROM `+d.segments+`
WHERE id = ? AND status = 'pending' AND claimer = ?`, p.name, seg.id, d.claimer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, err
		}
		return nil, sql.ErrNoRows
	}
	var raw sql.RawBytes
	dest := []any{&seg.sink, &seg.attempt, &seg.rowsPending}
	if kept == nil {
		dest = append(dest, &raw)
	}
	if err := rows.Scan(dest...); err != nil {
		return nil, err
	}
	var recs []segRecord
	if kept != nil {
		recs, err = d.parseKept(kept)
	} else {
		recs, err = parsePayload(raw)
	}
	if err != nil {
		// Not something a retry fixes, and not something to skip: the
		// pipe stops here, loudly, until an operator looks.
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	return recs, nil
}

// parsePayload parses a segment payload held in the driver's buffer.
func parsePayload(raw sql.RawBytes) ([]segRecord, error) {
	payload := []byte(raw)
	if len(raw) == 0 || raw[0] != segmentS2 {
		// Uncompressed, the records would alias the driver's buffer.
		payload = bytes.Clone(raw)
	}
	return parseSegment(payload)
}

// releaseSegment gives up our claim of a segment we did not deliver. If
// the release fails (the state connection dropped, which is often why we
// are releasing), the claim is remembered and taken back by the next
// segment pass: a pipe's segments go strictly in order, so a claim left to
// lapse would stall the pipe for the whole claim lease while this process
// is alive and well (docs/ARCHITECTURE.md, invariant 8).
func (p *pipeDrainer) releaseSegment(ctx context.Context, id string) {
	if err := p.releaseClaim(ctx, stuckClaim{id: id}); err != nil {
		p.log.Warn("release segment claim; it is taken back on the next pass", zap.String("segment", id), zap.Error(err))
		p.setStuck(&stuckClaim{id: id})
	}
}

// stuckClaim is a segment claim of ours that is to be given up, or
// settled by writing its kept outcome.
type stuckClaim struct {
	id          string
	notBefore   time.Time // a hold: not before it ends
	keepAttempt bool      // the segment was sent: its attempt counts
	outcome     *segOutcome
}

// segOutcome is a delivered segment's outcome whose write failed past its
// retries (recordSegment).
type segOutcome struct {
	seg       *segment
	left      []leftRecord
	delivered []*segRecord
}

// detached reports whether a record of left is still being delivered.
func detached(left []leftRecord) bool {
	for _, l := range left {
		if l.call != nil {
			return true
		}
	}
	return false
}

// stuckOn reports whether id is our stuck claim, not yet taken back.
func (p *pipeDrainer) stuckOn(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stuck != nil && p.stuck.id == id
}

func (p *pipeDrainer) setStuck(c *stuckClaim) {
	p.mu.Lock()
	p.stuck = c
	p.mu.Unlock()
}

// takeBack gives up a stuck claim of ours, if there is one and it is due,
// or writes its kept outcome. Only this process's segment pass of the pipe
// claims its segments, so a segment still claimed by us is not in anyone's
// hands.
func (p *pipeDrainer) takeBack(ctx context.Context) error {
	p.mu.Lock()
	c := p.stuck
	p.mu.Unlock()
	if c == nil || time.Now().Before(c.notBefore) {
		return nil
	}
	if o := c.outcome; o != nil {
		var ok bool
		if err := p.d.withDeadline(ctx, func(wctx context.Context) (err error) { ok, err = p.writeSegment(wctx, o.seg, o.left); return err }); err != nil {
			p.d.cfg.Metrics.error(p.name, "record", err)
			return fmt.Errorf("record kept outcome of segment %s of %s: %w", c.id, p.name, err)
		}
		p.setStuck(nil)
		p.segmentRecorded(o.seg, o.left, o.delivered, ok)
		p.log.Info("recorded a kept segment outcome", zap.String("segment", c.id), zap.Bool("claim_held", ok))
		if ok && len(o.left) > 0 {
			p.poke() // rows for the row drainer
		}
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.d.stmtTimeout)
	defer cancel()
	if err := p.releaseClaim(rctx, *c); err != nil {
		return fmt.Errorf("take back our claim of segment %s of %s: %w", c.id, p.name, err)
	}
	p.setStuck(nil)
	p.log.Info("took back our own segment claim", zap.String("segment", c.id))
	return nil
}

// releaseClaim clears our claim of a segment, due at once, under the
// statement deadline (stmtTimeoutMin).
func (p *pipeDrainer) releaseClaim(ctx context.Context, c stuckClaim) error {
	d := p.d
	return d.withDeadline(ctx, func(wctx context.Context) error {
		_, err := d.cfg.DB.ExecContext(wctx, releaseStatement(d.segments, `id = ? AND claimer = ?`, false),
			releaseArgs(0, !c.keepAttempt, c.id, d.claimer)...)
		return err
	})
}

// openKeys returns the key hashes of the pipe's pending outbox rows: their
// keys' records in a segment queue behind them. Pending rows are few (the
// retries and the released), and the due index covers the read.
func (p *pipeDrainer) openKeys(ctx context.Context) (map[string]bool, error) {
	keys, err := state.Strings(ctx, p.d.cfg.DB, `SELECT DISTINCT key_hash FROM `+p.d.outbox+` FORCE INDEX (due)
WHERE pipe = ? AND status = 'pending'`, p.name)
	if err != nil {
		return nil, err
	}
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m, nil
}
