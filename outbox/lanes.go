package outbox

import (
	"context"
	"errors"
	"time"
)

// A job is one worker's share of a claim: lanes delivered one after the
// other (see claim).
type job struct {
	lanes     [][]Record
	claimedAt time.Time
}

func (j job) size() int {
	n := 0
	for _, l := range j.lanes {
		n += len(l)
	}
	return n
}

// leaseHeld reports whether this pipe's drain lease (if leases are used) is
// still held and locally valid.
func (p *pipeDrainer) leaseHeld() bool {
	if p.d.cfg.Leases == nil {
		return true
	}
	l, ok := p.d.cfg.Leases(p.name)
	return ok && l.Valid(time.Now())
}

// runJob delivers a job's lanes in order. A key whose row failed (retry or
// dead) has its later rows released. Lanes stop, and the rest is released,
// once stop ends (shutdown), the drain lease is lost (the next holder should
// not wait for our run) or half the claim lease has passed (a slow sink must
// not hold claims until they expire under us).
func (p *pipeDrainer) runJob(ctx, stop context.Context, j job) error {
	failed := map[string]bool{}
	var errs []error
	for li, lane := range j.lanes {
		if li > 0 && (stop.Err() != nil || time.Since(j.claimedAt) > p.d.cfg.ClaimLease/2 || !p.leaseHeld()) {
			var rest []Record
			for _, l := range j.lanes[li:] {
				rest = append(rest, l...)
			}
			p.release(ctx, rest)
			break
		}
		var todo, skip []Record
		for _, r := range lane {
			if failed[r.Key] {
				skip = append(skip, r)
			} else {
				todo = append(todo, r)
			}
		}
		p.release(ctx, skip)
		for len(todo) > 0 {
			n := min(len(todo), p.cfg.BatchSize)
			chunk := todo[:n:n]
			todo = todo[n:]
			res, err := p.deliverAndRecord(ctx, stop, j.claimedAt, chunk)
			if err != nil {
				errs = append(errs, err)
			}
			for i, r := range chunk {
				if err != nil || res[i] != nil {
					failed[r.Key] = true
				}
			}
		}
	}
	return errors.Join(errs...)
}

// deliverAndRecord hands one batch to the sink and records every outcome.
func (p *pipeDrainer) deliverAndRecord(ctx, stop context.Context, claimedAt time.Time, recs []Record) ([]error, error) {
	defer p.finished(recs)
	start := time.Now()
	errs := p.deliverTimed(stop, claimedAt, recs)
	return errs, p.record(ctx, recs, errs, time.Since(start))
}

// finished forgets rows that are no longer in a delivery of ours; a row
// whose outcome is kept unwritten stays (keep, writeKept).
func (p *pipeDrainer) finished(recs []Record) {
	p.mu.Lock()
	for _, r := range recs {
		if p.keptIDs[r.ID] {
			continue
		}
		delete(p.inflight, r.ID)
		delete(p.failedBefore, r.ID)
	}
	p.mu.Unlock()
}
