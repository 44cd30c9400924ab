package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/sink"
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
// Except in an outage: when the first round fails for every key it tried
// (two keys at least), every failure retryable, the segment is not taken
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
}

// leftRecord is a record that leaves its segment as an outbox row.
type leftRecord struct {
	rec     *segRecord
	attempt int    // attempts the row starts with: 0 for records not tried
	status  string // pending or dead
	delay   time.Duration
	errText string
	// overload: the receiver was at capacity; not an attempt (none is
	// logged, and attempt is the count before this claim).
	overload bool
	// call is set for a record still being delivered when its segment
	// is recorded (a stalled call, see deliverConcurrently): its row is
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
	if err != nil || seg == nil {
		return 0, err
	}
	// From the claim on, the segment is finished even during a stop: what
	// is not delivered by then leaves it as outbox rows.
	wctx := context.WithoutCancel(ctx)
	blocked, err := p.openKeys(wctx)
	if err != nil {
		p.releaseSegment(wctx, seg.id)
		return 0, fmt.Errorf("segment %s of %s: read keys with pending rows: %w", seg.id, p.name, err)
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
		// Taken back and delivered again under the same ids; the attempt
		// counts.
		p.setStuck(&stuckClaim{id: seg.id, keepAttempt: true})
		return len(seg.recs), err
	}
	recorded = ok
	if len(left) > 0 {
		p.poke() // rows for the row drainer
	}
	return len(seg.recs), nil
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
// (unclaimed, or its claim lapsed). Segments are delivered strictly in
// order, so a newer one is never taken while an older one is claimed.
func (p *pipeDrainer) claimSegment(ctx context.Context) (*segment, error) {
	d := p.d
	l, fenced, err := p.drainLease()
	if err != nil {
		return nil, err
	}
	var id string
	err = d.cfg.DB.QueryRowContext(ctx, `SELECT id FROM `+d.segments+`
WHERE pipe = ? AND status = 'pending' ORDER BY id LIMIT 1`, p.name).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("claim segment of %s: %w", p.name, err)
	}
	// Due: unclaimed and not held (next_attempt_at is its creation or
	// release), a lapsed claim, or a hold that ended.
	q, args := d.claimUpdate(l, fenced, d.segments+` s`,
		`s.claimer = ?, s.next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND, s.attempts = s.attempts + 1`,
		`s.id = ? AND s.status = 'pending' AND s.next_attempt_at <= NOW(6)`, []any{id})
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	res, err := d.cfg.DB.ExecContext(cctx, q, args...)
	if err != nil {
		p.releaseSegment(cctx, id)
		return nil, fmt.Errorf("claim segment %s of %s: %w", id, p.name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, nil // claimed by another drainer, or our lease is gone
	}
	seg := &segment{id: id, claimedAt: time.Now()}
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
	rows, err := d.cfg.DB.QueryContext(ctx, `SELECT sink, attempts, payload FROM `+d.segments+`
WHERE id = ? AND status = 'pending' AND claimer = ?`, seg.id, d.claimer)
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
	if err := rows.Scan(&seg.sink, &seg.attempt, &raw); err != nil {
		return nil, err
	}
	payload := []byte(raw)
	if len(raw) == 0 || raw[0] != segmentS2 {
		// Uncompressed, the records would alias the driver's buffer.
		payload = bytes.Clone(raw)
	}
	recs, err := parseSegment(payload)
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

// releaseSegment gives up our claim of a segment we did not deliver. If
// the release fails (the state connection dropped, which is often why we
// are releasing), the claim is remembered and taken back by the next
// segment pass: a pipe's segments go strictly in order, so a claim left to
// lapse would stall the pipe for the whole claim lease while this process
// is alive and well (DESIGN.md, Invariant 8).
func (p *pipeDrainer) releaseSegment(ctx context.Context, id string) {
	if err := p.releaseClaim(ctx, stuckClaim{id: id}); err != nil {
		p.log.Warn("release segment claim; it is taken back on the next pass", zap.String("segment", id), zap.Error(err))
		p.setStuck(&stuckClaim{id: id})
	}
}

// stuckClaim is a segment claim of ours that is to be given up.
type stuckClaim struct {
	id          string
	notBefore   time.Time // a hold: not before it ends
	keepAttempt bool      // the segment was sent: its attempt counts
}

func (p *pipeDrainer) setStuck(c *stuckClaim) {
	p.mu.Lock()
	p.stuck = c
	p.mu.Unlock()
}

// takeBack gives up a stuck claim of ours, if there is one and it is due.
// Only this process's segment pass of the pipe claims its segments, so a
// segment still claimed by us is not in anyone's hands.
func (p *pipeDrainer) takeBack(ctx context.Context) error {
	p.mu.Lock()
	c := p.stuck
	p.mu.Unlock()
	if c == nil || time.Now().Before(c.notBefore) {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := p.releaseClaim(rctx, *c); err != nil {
		return fmt.Errorf("take back our claim of segment %s of %s: %w", c.id, p.name, err)
	}
	p.setStuck(nil)
	p.log.Info("took back our own segment claim", zap.String("segment", c.id))
	return nil
}

// releaseClaim clears our claim of a segment, due at once.
func (p *pipeDrainer) releaseClaim(ctx context.Context, c stuckClaim) error {
	d := p.d
	_, err := d.cfg.DB.ExecContext(ctx, releaseStatement(d.segments, `id = ? AND claimer = ?`, false),
		releaseArgs(0, !c.keepAttempt, c.id, d.claimer)...)
	return err
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

// segmentHold is why and how long a segment waits whole (a sink outage).
type segmentHold struct {
	tried   int
	delay   time.Duration
	errText string
	// overload: every record was refused for capacity; the attempt is
	// given back.
	overload bool
}

// deliverSegment delivers seg's records in rounds: each round sends the
// next record of every key still going, in calls of at most BatchSize
// records (distinct keys) with at most Concurrency calls at once. It
// returns the records that leave the segment and the delivered ones, or a
// hold when the first round looks like an outage.
func (p *pipeDrainer) deliverSegment(stop context.Context, seg *segment, blocked map[string]bool) (left []leftRecord, delivered []*segRecord, hold *segmentHold) {
	// Lanes: each key's records in order.
	var order []string
	lanes := map[string][]*segRecord{}
	for i := range seg.recs {
		r := &seg.recs[i]
		if blocked[r.keyHash] {
			left = append(left, leftRecord{rec: r, status: "pending"})
			continue
		}
		if _, ok := lanes[r.keyHash]; !ok {
			order = append(order, r.keyHash)
		}
		lanes[r.keyHash] = append(lanes[r.keyHash], r)
	}
	failed := map[string]bool{}
	for round := 0; len(order) > 0; round++ {
		if stop.Err() != nil || time.Since(seg.claimedAt) > p.d.cfg.ClaimLease/2 || !p.leaseHeld() {
			break
		}
		batch := make([]Record, 0, len(order))
		roundRecs := make([]*segRecord, 0, len(order))
		next := order[:0]
		for _, k := range order {
			lane := lanes[k]
			roundRecs = append(roundRecs, lane[0])
			batch = append(batch, lane[0].record(p.name, seg.sink, seg.attempt))
			if lanes[k] = lane[1:]; len(lane) > 1 {
				next = append(next, k)
			} else {
				delete(lanes, k)
			}
		}
		order = next
		errs, calls := p.deliverConcurrently(stop, seg.claimedAt, batch, true)
		if stop.Err() != nil || !p.leaseHeld() {
			// Overloaded answers of a delivery that is stopping are
			// records not sent.
			for i, err := range errs {
				if err != nil && sink.IsOverloaded(err) {
					errs[i] = errNotSent
				}
			}
		}
		if round == 0 && seg.attempt < p.cfg.MaxAttempts && len(calls) == 0 {
			if h := p.outage(errs); h != nil {
				return nil, nil, h
			}
		}
		for i, r := range roundRecs {
			switch {
			case calls != nil && calls[i] != nil:
				// Still under way: its row is written claimed by us, and
				// the key's later records queue behind it.
				left = append(left, leftRecord{rec: r, attempt: seg.attempt, status: "pending", call: calls[i]})
			case errs[i] == nil:
				delivered = append(delivered, r)
				continue
			case errors.Is(errs[i], errNotSent):
				left = append(left, leftRecord{rec: r, status: "pending"})
			default:
				left = append(left, p.failedRecord(r, seg.attempt, errs[i]))
			}
			failed[r.keyHash] = true
		}
		// A failed key's later records leave the segment untried, behind
		// the failed one.
		if len(failed) > 0 {
			next := order[:0]
			for _, k := range order {
				if !failed[k] {
					next = append(next, k)
					continue
				}
				for _, r := range lanes[k] {
					left = append(left, leftRecord{rec: r, status: "pending"})
				}
				delete(lanes, k)
			}
			order = next
		}
	}
	// Stopped early: the rest goes to the row drainer.
	for _, k := range order {
		for _, r := range lanes[k] {
			left = append(left, leftRecord{rec: r, status: "pending"})
		}
	}
	return left, delivered, nil
}

// outage returns a hold when a first round's errors look like the sink is
// down rather than some records being bad: two or more records tried,
// every one failed, none permanently. The delay is the largest Retry-After
// asked for, else the backoff of the segment's attempt.
func (p *pipeDrainer) outage(errs []error) *segmentHold {
	if len(errs) < 2 {
		return nil
	}
	h := &segmentHold{tried: len(errs), delay: -1, overload: true}
	for _, err := range errs {
		if err == nil || errors.Is(err, errNotSent) || sink.IsPermanent(err) {
			return nil
		}
		h.overload = h.overload && sink.IsOverloaded(err)
		if ra, ok := sink.RetryAfterOf(err); ok && ra > h.delay {
			h.delay = ra
		}
	}
	h.errText = truncate(errs[0].Error(), maxErrorLen)
	return h
}

// holdSegment gives a segment back to wait out h's delay whole, with the
// error that made it wait.
func (p *pipeDrainer) holdSegment(ctx context.Context, seg *segment, h *segmentHold) error {
	d := p.d
	giveBack := 0
	if h.overload {
		giveBack = 1
	}
	if h.delay < 0 {
		h.delay = d.backoff.Delay(seg.attempt - giveBack)
	}
	if _, err := d.cfg.DB.ExecContext(ctx, releaseStatement(d.segments, `id = ? AND claimer = ?`, true),
		releaseArgs(h.delay, h.overload, h.errText, seg.id, d.claimer)...); err != nil {
		// drainSegment remembers the claim and takes it back when the hold ends.
		return fmt.Errorf("hold segment %s of %s: %w", seg.id, p.name, err)
	}
	d.cfg.Metrics.retried(p.name, h.tried)
	msg := "sink failing for every record tried; segment waits and is tried again whole"
	if h.overload {
		msg = "receiver overloaded for every record tried; segment waits and is tried again whole (not counted as an attempt)"
	}
	p.logFailure(msg, h.tried, h.errText, zap.String("segment", seg.id), zap.Int("attempt", seg.attempt-giveBack), zap.Duration("retry_in", h.delay))
	p.retryDueIn(h.delay)
	return nil
}

// errNotSent marks records of calls not started because the delivery is
// stopping.
var errNotSent = errors.New("not sent: the drainer is stopping")

// Detaching stalled calls: once nine tenths of a round's records are
// done, the rest is waited for at most stallAfterFactor × the mean time
// of the calls done so far (at least stallAfterMin); calls still under way
// then no longer hold the round, the segment and the pipe's later
// segments (a request that waits for a dropped connect, or a receiver
// thread that hangs): see deliverSegment.
const (
	stallAfterFactor = 4
	stallAfterMin    = 100 * time.Millisecond
	// perRecordCall is the call size for sinks that send one request per
	// record and pace themselves.
	perRecordCall = 16
)

// deliverConcurrently sends recs (distinct keys) in calls of at most
// BatchSize, at most Concurrency at once, and returns one error per record.
// Once stop ends no further call starts (their records get errNotSent);
// calls under way finish, bounded by the pipe's timeout (see callContext
// for paced sinks).
//
// With detach, calls that stall (see stallAfterFactor) are not waited for:
// calls[i] is set for their records (calls is nil when none stalled), and
// the call's errors arrive on its done channel.
func (p *pipeDrainer) deliverConcurrently(stop context.Context, claimedAt time.Time, recs []Record, detach bool) (errs []error, calls []*detachedCall) {
	errs = make([]error, len(recs))
	batch, conc := p.cfg.BatchSize, p.cfg.Concurrency
	if p.perRecord() {
		// One request per record, paced by the sink: small calls, as many
		// at once as the pipe allowed records in flight, so that one slow
		// request holds few others (calls of one cost cdcout 15 % more
		// CPU per change end to end than calls of 16).
		batch = min(perRecordCall, p.cfg.BatchSize)
		conc = max(1, p.cfg.Concurrency*p.cfg.BatchSize/batch)
	}
	type result struct {
		start int
		errs  []error
		took  time.Duration
	}
	results := make(chan result, (len(recs)+batch-1)/batch)
	running := map[int]*detachedCall{}
	sem := make(chan struct{}, conc)
	started, finished, doneRecs := 0, 0, 0
	var took time.Duration
	collect := func(r result) {
		copy(errs[r.start:], r.errs)
		delete(running, r.start)
		finished++
		doneRecs += len(r.errs)
		took += r.took
	}
	for start := 0; start < len(recs); start += batch {
		end := min(start+batch, len(recs))
	acquire:
		for {
			select {
			case sem <- struct{}{}:
				break acquire
			case r := <-results:
				collect(r)
			}
		}
		if stop.Err() != nil {
			<-sem
			for i := start; i < end; i++ {
				errs[i] = errNotSent
			}
			doneRecs += end - start
			continue
		}
		c := &detachedCall{recs: recs[start:end], start: time.Now(), done: make(chan []error, 1)}
		running[start] = c
		started++
		go func() {
			defer func() { <-sem }()
			e := p.deliverTimed(stop, claimedAt, c.recs)
			c.done <- e
			results <- result{start: start, errs: e, took: time.Since(c.start)}
		}()
	}
	for finished < started {
		var timeout <-chan time.Time
		if detach && p.paced() && doneRecs*10 >= 9*len(recs) && finished > 0 {
			wait := max(stallAfterMin, stallAfterFactor*took/time.Duration(finished))
			timer := time.NewTimer(wait)
			timeout = timer.C
			select {
			case r := <-results:
				timer.Stop()
				collect(r)
				continue
			case <-timeout:
			}
			// The rest stalls: its calls go on without us.
			calls = make([]*detachedCall, len(recs))
			for start, c := range running {
				for i := range c.recs {
					calls[start+i] = c
				}
			}
			go func(n int) { // drain the results channel
				for range n {
					<-results
				}
			}(started - finished)
			return errs, calls
		}
		collect(<-results)
	}
	return errs, nil
}

// perRecord reports whether the pipe's sink paces itself and sends one
// request per record (httpsink without batch).
func (p *pipeDrainer) perRecord() bool {
	pr, ok := p.cfg.Sink.(interface{ OneRequestPerRecord() bool })
	return ok && pr.OneRequestPerRecord() && p.paced()
}

// deliverTimed is one Deliver call bounded by the pipe's timeout (or, for
// paced sinks, by the stop and the claim: see callContext).
func (p *pipeDrainer) deliverTimed(stop context.Context, claimedAt time.Time, recs []Record) []error {
	dctx, cancel := p.callContext(stop, claimedAt)
	defer cancel()
	start := time.Now()
	errs := p.deliver(dctx, recs)
	if dctx.Err() != nil && !p.paced() {
		for i, err := range errs {
			if err != nil && errors.Is(err, context.DeadlineExceeded) {
				errs[i] = fmt.Errorf("delivery timed out after %v: %w", p.cfg.Timeout, err)
			}
		}
	}
	p.d.cfg.Metrics.batch(p.name, len(recs), time.Since(start))
	return errs
}

// failedRecord is the row a failed record becomes: retried after its
// backoff, or dead.
func (p *pipeDrainer) failedRecord(r *segRecord, attempt int, err error) leftRecord {
	l := leftRecord{rec: r, attempt: attempt, status: "pending"}
	if sink.IsOverloaded(err) {
		l.attempt, l.overload = max(attempt-1, 0), true
	}
	dead, delay, errText := p.verdict(err, attempt)
	if dead {
		l.status = "dead"
	}
	l.delay, l.errText = delay, errText
	return l
}

// recordSegment marks the segment done and writes the records that left it
// as outbox rows, in one transaction, conditional on our claim: if it
// lapsed and another drainer took the segment, that drainer records it.
func (p *pipeDrainer) recordSegment(ctx context.Context, seg *segment, left []leftRecord, delivered []*segRecord) (bool, error) {
	d := p.d
	write := func() (bool, error) {
		tx, err := d.cfg.DB.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer tx.Rollback()
		res, err := tx.ExecContext(ctx, `UPDATE `+d.segments+` SET status = 'done', next_attempt_at = NOW(6)
WHERE id = ? AND status = 'pending' AND claimer = ?`, seg.id, d.claimer)
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
	var ok bool
	if err := p.writeOutcome(func() (err error) { ok, err = write(); return err }); err != nil {
		return false, fmt.Errorf("record segment %s of %s (left to its claim lease): %w", seg.id, p.name, err)
	}
	if !ok {
		p.log.Warn("segment claim lapsed before its outcome was written; another drainer has it",
			zap.String("segment", seg.id))
		return false, nil
	}
	commits := make([]time.Time, len(delivered))
	for i, r := range delivered {
		commits[i] = r.commitTS
	}
	d.cfg.Metrics.deliveredAt(p.name, commits)
	var (
		nRetry, nDead int
		first         *leftRecord
	)
	minDelay := time.Duration(-1)
	for i, l := range left {
		switch {
		case l.status == "dead":
			nDead++
			p.log.Error("dead-lettered", zap.String("id", l.rec.id), zap.Int("attempt", l.attempt), zap.String("error", l.errText))
		case l.errText != "":
			nRetry++
			if first == nil {
				first = &left[i]
			}
			if minDelay < 0 || l.delay < minDelay {
				minDelay = l.delay
			}
		}
	}
	if nRetry > 0 {
		d.cfg.Metrics.retried(p.name, nRetry)
		msg := "delivery failed, will retry"
		if first.overload {
			msg = "delivery failed, receiver overloaded; will retry without counting an attempt"
		}
		p.logFailure(msg, nRetry, first.errText, zap.String("segment", seg.id), zap.String("id", first.rec.id),
			zap.Int("attempt", first.attempt), zap.Duration("retry_in", first.delay))
	}
	if nDead > 0 {
		d.cfg.Metrics.dead(p.name, nDead)
	}
	if minDelay >= 0 {
		p.retryDueIn(minDelay)
	}
	return true, nil
}

// insertLeft writes the records that left a segment as outbox rows, and
// the attempt log of the failed ones.
func (p *pipeDrainer) insertLeft(ctx context.Context, tx *sql.Tx, seg *segment, left []leftRecord) error {
	d := p.d
	var (
		q     strings.Builder
		args  []any
		logQ  strings.Builder
		lArgs []any
		n     int
		size  int
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
			l.status, l.attempt, claimer, delay.Microseconds(), errText, errAt)
		n++
		size += r.size()
		if l.errText != "" && !l.overload {
			if len(lArgs) > 0 {
				logQ.WriteByte(',')
			}
			logQ.WriteString("(?, ?, NOW(6), 0, ?)")
			lArgs = append(lArgs, r.id, l.attempt, l.errText)
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if len(lArgs) > 0 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+d.attempt+` (outbox_id, n, at, duration_us, error) VALUES `+logQ.String()+
			` ON DUPLICATE KEY UPDATE at = VALUES(at), duration_us = VALUES(duration_us), error = VALUES(error)`, lArgs...); err != nil {
			return fmt.Errorf("log attempts: %w", err)
		}
	}
	return nil
}
