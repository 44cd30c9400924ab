package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
)

// paced reports whether the pipe's sink paces itself (see Paced).
func (p *pipeDrainer) paced() bool {
	ps, ok := p.cfg.Sink.(Paced)
	return ok && ps.Paced()
}

// callContext is the context of one Deliver call of work claimed at
// claimedAt: the pipe's Timeout for ordinary sinks (not cut short by a
// stop: calls under way finish); for paced sinks, until the drainer stops
// or half the claim lease has passed, whichever is first.
func (p *pipeDrainer) callContext(stop context.Context, claimedAt time.Time) (context.Context, context.CancelFunc) {
	if !p.paced() {
		return context.WithTimeout(context.WithoutCancel(stop), p.cfg.Timeout)
	}
	return context.WithDeadline(stop, claimedAt.Add(p.d.cfg.ClaimLease/2))
}

// deliver calls the sink, turning a panic or a short result into errors so
// one misbehaving sink cannot take the drainer down or lose an outcome.
func (p *pipeDrainer) deliver(ctx context.Context, recs []Record) (errs []error) {
	defer func() {
		if v := recover(); v != nil {
			p.log.Error("sink panicked", zap.Any("panic", v))
			errs = make([]error, len(recs))
			for i := range errs {
				errs[i] = fmt.Errorf("sink panicked: %v", v)
			}
		}
	}()
	got := p.cfg.Sink.Deliver(ctx, recs)
	errs = make([]error, len(recs))
	// An empty result means every record was delivered; any other length
	// mismatch is an error for the records without a result.
	if len(got) == 0 {
		return errs
	}
	for i := range errs {
		if i < len(got) {
			errs[i] = got[i]
		} else {
			errs[i] = fmt.Errorf("sink returned %d results for %d records", len(got), len(recs))
		}
	}
	return errs
}

// perRecord reports whether the pipe's sink paces itself and sends one
// request per record (httpsink without batch).
func (p *pipeDrainer) perRecord() bool {
	pr, ok := p.cfg.Sink.(interface{ OneRequestPerRecord() bool })
	return ok && pr.OneRequestPerRecord() && p.paced()
}

// deliverTimed is one Deliver call bounded by the pipe's timeout (or, for
// paced sinks, by the stop and the claim: see callContext), for rows and
// segments alike.
func (p *pipeDrainer) deliverTimed(stop context.Context, claimedAt time.Time, recs []Record) []error {
	dctx, cancel := p.callContext(stop, claimedAt)
	defer cancel()
	start := time.Now()
	errs := p.deliver(dctx, recs)
	if dctx.Err() != nil && !p.paced() {
		// The sink returned after its deadline; an error it reports as a
		// plain context error is a timeout, and says so.
		for i, err := range errs {
			if err != nil && errors.Is(err, context.DeadlineExceeded) {
				errs[i] = fmt.Errorf("delivery timed out after %v: %w", p.cfg.Timeout, err)
			}
		}
	}
	p.d.cfg.Metrics.batch(p.name, len(recs), time.Since(start))
	return errs
}
