package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/sink"
)

// segmentHold is why and how long a segment waits whole (a sink outage).
type segmentHold struct {
	tried   int
	delay   time.Duration
	errText string
	// overload: every record was refused for capacity; the attempt is
	// given back.
	overload bool
}

// deliverSegment delivers seg's records, each key's in order and
// different keys concurrently, in calls of at most BatchSize records
// (distinct keys) with at most Concurrency calls at once. A key's next
// record goes out as soon as its previous one is delivered, not when a
// whole round of every key is: a slow answer (a receiver thread that
// waited for the CPU, a connect dropped from a full accept queue) then
// holds only its call's keys while the rest keep the endpoint's limit
// full (with rounds, one 300 ms answer left Python's http.server idle for
// 300 ms). It returns the records that leave the segment and the
// delivered ones, or a hold when the first record of every key failed
// (an outage).
func (p *pipeDrainer) deliverSegment(stop context.Context, seg *segment, blocked map[string]bool) (left []leftRecord, delivered []*segRecord, hold *segmentHold) {
	r := p.newSegRun(stop, seg)
	for i := range seg.recs {
		rec := &seg.recs[i]
		if blocked[rec.keyHash] {
			r.left = append(r.left, leftRecord{rec: rec, status: StatusPending})
			continue
		}
		if _, ok := r.lanes[rec.keyHash]; !ok {
			r.ready = append(r.ready, rec.keyHash)
			r.heads[rec] = true
		}
		r.lanes[rec.keyHash] = append(r.lanes[rec.keyHash], rec)
	}
	r.headsLeft = len(r.heads)
	for {
		r.dispatch()
		if len(r.running) == 0 {
			break
		}
		res, ok := r.next()
		if !ok {
			r.detachRunning()
			continue
		}
		if h := r.collect(res); h != nil {
			return nil, nil, h
		}
	}
	// Stopped early: the rest goes to the row drainer.
	for _, k := range r.ready {
		r.dropLane(k, r.lanes[k])
	}
	return r.left, r.delivered, nil
}

// segRun is one segment's delivery under way (deliverSegment).
type segRun struct {
	p           *pipeDrainer
	stop        context.Context
	seg         *segment
	batch, conc int
	// detach: calls that stall are left to finish on rows of their own
	// (see stallAfterFactor).
	detach bool
	lanes  map[string][]*segRecord // each key's records not yet sent, in order
	ready  []string                // keys whose next record may go, oldest first
	// heads are the first record of every key: when every one of them
	// failed, none permanently, the segment is held whole (outage).
	heads     map[*segRecord]bool
	headsLeft int
	headErrs  []error
	headsDone bool // decided (or no hold possible: a call was detached)

	results     chan callResult
	running     map[*detachedCall][]*segRecord
	runningRecs int
	finished    int // calls returned
	doneRecs    int // their records
	took        time.Duration

	left      []leftRecord
	delivered []*segRecord
}

// callResult is one Deliver call's outcome.
type callResult struct {
	call *detachedCall
	errs []error
	took time.Duration
}

func (p *pipeDrainer) newSegRun(stop context.Context, seg *segment) *segRun {
	batch, conc := p.cfg.BatchSize, p.cfg.Concurrency
	if p.perRecord() {
		// One request per record, paced by the sink: small calls, as many
		// at once as the pipe allowed records in flight, so that one slow
		// request holds few others (calls of one cost cdcout 15 % more
		// CPU per change end to end than calls of 16).
		batch = min(perRecordCall, p.cfg.BatchSize)
		conc = max(1, p.cfg.Concurrency*p.cfg.BatchSize/batch)
	}
	return &segRun{p: p, stop: stop, seg: seg, batch: batch, conc: conc,
		detach: !seg.fenced() && p.paced(),
		lanes:  map[string][]*segRecord{}, heads: map[*segRecord]bool{},
		// Every call sends one record at least: its result never waits
		// for a reader, also after the call was detached.
		results: make(chan callResult, len(seg.recs)),
		running: map[*detachedCall][]*segRecord{}}
}

// stopping reports whether no further call may start: shutdown, the drain
// lease lost, or half the claim lease spent.
func (r *segRun) stopping() bool {
	return r.stop.Err() != nil || time.Since(r.seg.claimedAt) > r.p.d.cfg.ClaimLease/2 || !r.p.leaseHeld()
}

// dispatch starts calls of the ready keys' next records while fewer than
// conc calls are under way.
func (r *segRun) dispatch() {
	p, seg := r.p, r.seg
	for len(r.ready) > 0 && len(r.running) < r.conc && !r.stopping() {
		n := min(r.batch, len(r.ready))
		recs := make([]*segRecord, n)
		batch := make([]Record, n)
		for i, k := range r.ready[:n] {
			lane := r.lanes[k]
			recs[i], r.lanes[k] = lane[0], lane[1:]
			batch[i] = lane[0].record(p.name, seg.sink, seg.attempt)
		}
		r.ready = r.ready[n:]
		c := &detachedCall{recs: batch, start: time.Now(), done: make(chan []error, 1)}
		r.running[c] = recs
		r.runningRecs += n
		go func() {
			e := p.deliverTimed(r.stop, seg.claimedAt, c.recs)
			c.done <- e
			r.results <- callResult{call: c, errs: e, took: time.Since(c.start)}
		}()
	}
}

// next waits for a call to return. Once no further call can start and
// nine tenths of the records sent so far are done, it waits at most
// stallAfterFactor × the mean call time (at least stallAfterMin) and
// reports false when none returned by then: the calls under way stall.
func (r *segRun) next() (callResult, bool) {
	blocked := len(r.ready) == 0 || len(r.running) >= r.conc
	if !r.detach || !blocked || r.finished == 0 || r.doneRecs*10 < 9*(r.doneRecs+r.runningRecs) {
		return <-r.results, true
	}
	timer := time.NewTimer(max(stallAfterMin, stallAfterFactor*r.took/time.Duration(r.finished)))
	defer timer.Stop()
	select {
	case res := <-r.results:
		return res, true
	case <-timer.C:
		return callResult{}, false
	}
}

// collect takes a returned call's outcome: a delivered record makes its
// key ready for the next; a failed or unsent one leaves the segment with
// the later records of its key. It returns a hold once the first record
// of every key failed, none permanently.
func (r *segRun) collect(res callResult) *segmentHold {
	recs, ok := r.running[res.call]
	if !ok {
		return nil // detached: its outcome lands on its row (finishDetached)
	}
	delete(r.running, res.call)
	r.runningRecs -= len(recs)
	r.finished++
	r.doneRecs += len(recs)
	r.took += res.took
	// Overloaded answers of a delivery that is stopping are records not
	// sent.
	stopping := r.stop.Err() != nil || !r.p.leaseHeld()
	for i, rec := range recs {
		err := res.errs[i]
		if stopping && err != nil && sink.IsOverloaded(err) {
			err = errNotSent
		}
		if r.heads[rec] {
			r.headErrs = append(r.headErrs, err)
			r.headsLeft--
		}
		lane := r.lanes[rec.keyHash]
		switch {
		case err == nil:
			r.delivered = append(r.delivered, rec)
			if len(lane) > 0 {
				r.ready = append(r.ready, rec.keyHash)
			} else {
				delete(r.lanes, rec.keyHash)
			}
			continue
		case errors.Is(err, errNotSent):
			r.left = append(r.left, leftRecord{rec: rec, status: StatusPending})
		default:
			r.left = append(r.left, r.p.failedRecord(rec, r.seg.attempt, err))
		}
		// The key's later records leave the segment untried, behind it.
		r.dropLane(rec.keyHash, lane)
	}
	if r.headsLeft == 0 && !r.headsDone {
		r.headsDone = true
		if r.seg.attempt < r.p.cfg.MaxAttempts {
			return r.p.outage(r.headErrs)
		}
	}
	return nil
}

// detachRunning leaves the calls under way to finish without the
// segment: their records leave it as rows claimed by us, the later
// records of their keys as pending rows behind them.
func (r *segRun) detachRunning() {
	for c, recs := range r.running {
		for _, rec := range recs {
			r.left = append(r.left, leftRecord{rec: rec, attempt: r.seg.attempt, status: StatusPending, call: c})
			r.dropLane(rec.keyHash, r.lanes[rec.keyHash])
		}
	}
	clear(r.running)
	r.runningRecs = 0
	r.headsDone = true // a detached call's outcome is not known: no hold
}

// dropLane moves a key's records not yet sent out of the segment, untried.
func (r *segRun) dropLane(key string, lane []*segRecord) {
	for _, rec := range lane {
		r.left = append(r.left, leftRecord{rec: rec, status: StatusPending})
	}
	delete(r.lanes, key)
}

// outage returns a hold when the errors of every key's first record look
// like the sink is down rather than some records being bad: two or more
// records tried,
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
	if err := d.withDeadline(ctx, func(wctx context.Context) error {
		_, err := d.cfg.DB.ExecContext(wctx, releaseStatement(d.segments, `id = ? AND claimer = ?`, true),
			releaseArgs(h.delay, h.overload, h.errText, seg.id, d.claimer)...)
		return err
	}); err != nil {
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

// errNotSent marks records whose overloaded answer came while the
// delivery is stopping: not sent, not an attempt.
var errNotSent = errors.New("not sent: the drainer is stopping")

// Detaching stalled calls: once no further call can start and nine tenths
// of the records sent so far are done, the rest is waited for at most
// stallAfterFactor × the mean time of the calls done so far (at least
// stallAfterMin); calls still under way then no longer hold the segment
// and the pipe's later segments (a request that waits for a dropped
// connect, or a receiver thread that hangs): see segRun.next.
const (
	stallAfterFactor = 4
	stallAfterMin    = 100 * time.Millisecond
	// perRecordCall is the call size for sinks that send one request per
	// record and pace themselves.
	perRecordCall = 16
)

// failedRecord is the row a failed record becomes: retried after its
// backoff, or dead.
func (p *pipeDrainer) failedRecord(r *segRecord, attempt int, err error) leftRecord {
	l := leftRecord{rec: r, attempt: attempt, status: StatusPending}
	if sink.IsOverloaded(err) {
		l.attempt, l.overload = max(attempt-1, 0), true
	}
	dead, delay, errText := p.verdict(err, attempt)
	if dead {
		l.status = StatusDead
	}
	l.delay, l.errText = delay, errText
	return l
}
