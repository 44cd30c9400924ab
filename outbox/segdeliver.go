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
			left = append(left, leftRecord{rec: r, status: StatusPending})
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
				left = append(left, leftRecord{rec: r, attempt: seg.attempt, status: StatusPending, call: calls[i]})
			case errs[i] == nil:
				delivered = append(delivered, r)
				continue
			case errors.Is(errs[i], errNotSent):
				left = append(left, leftRecord{rec: r, status: StatusPending})
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
					left = append(left, leftRecord{rec: r, status: StatusPending})
				}
				delete(lanes, k)
			}
			order = next
		}
	}
	// Stopped early: the rest goes to the row drainer.
	for _, k := range order {
		for _, r := range lanes[k] {
			left = append(left, leftRecord{rec: r, status: StatusPending})
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
