package sink

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"
)

// overloadedError marks a record that was not delivered because the
// receiver is at capacity or asked to wait (HTTP 429 or 503, a refused or
// timed-out connect, broker throttling): not the record's fault. The
// drainer retries it without counting an attempt and never dead-letters
// it for this.
type overloadedError struct{ err error }

func (e *overloadedError) Error() string    { return e.err.Error() }
func (e *overloadedError) Unwrap() error    { return e.err }
func (e *overloadedError) Overloaded() bool { return true }

// Overloaded wraps err so that IsOverloaded reports true.
func Overloaded(err error) error {
	if err == nil {
		return nil
	}
	return &overloadedError{err: err}
}

// IsOverloaded reports whether any error in err's chain says Overloaded().
func IsOverloaded(err error) bool {
	var o interface{ Overloaded() bool }
	return errors.As(err, &o) && o.Overloaded()
}

// Limiter defaults: a handful in flight to start with, and a ceiling that
// a receiver's measured latency has to earn.
const (
	DefaultInitialLimit = 4
	DefaultMaxLimit     = 64
)

// Limiter timing. The latency target is twice the round-trip floor plus
// latencySlack: a few milliseconds of queueing at the receiver cost nothing
// and let a fast receiver on a busy machine keep many requests in flight;
// beyond it requests are only waiting in the receiver's queue.
const (
	latencySlack  = 3 * time.Millisecond
	floorWindow   = 10 * time.Second // the floor is the minimum of the last two windows
	pauseBase     = 100 * time.Millisecond
	pauseCap      = 5 * time.Second // an endpoint that came back is noticed within this
	maxRetryAfter = 10 * time.Minute
)

// Signal is what one request's outcome says about the receiver's capacity.
type Signal int

const (
	// Success: answered (any status that is not an overload); rtt counts.
	Success Signal = iota
	// Failed: no answer about capacity (the request failed for another
	// reason); the limit does not move.
	Failed
	// Overload: 429/503, a refused or timed-out connect, a request that
	// timed out: cut the limit sharply.
	Overload
)

// LimiterStats is a snapshot of a Limiter.
type LimiterStats struct {
	Limit    int
	Max      int // the ceiling
	InFlight int
	// RTT is the smoothed round-trip time of successful requests, Floor the
	// lowest seen recently (the receiver's unloaded latency).
	RTT, Floor time.Duration
	// PausedFor is how much longer no request starts (Retry-After, or
	// backing off a receiver that refuses every request).
	PausedFor time.Duration
	// Overloads counts overload signals since start.
	Overloads int64
}

// Limiter is an adaptive concurrency limit for one endpoint, in the manner
// of TCP congestion control and Envoy's adaptive concurrency filter:
//
//   - it measures the receiver's unloaded latency (the floor) with one
//     request in flight, for three requests at the start and every
//     floorWindow;
//   - it grows while answers come back near the floor and the limit is in
//     use: doubling per round trip up to slowStartEnd, then one more per
//     round trip;
//   - it shrinks gently when latency shows a queue at the receiver, and
//     halves on an overload signal (at most once per round trip, so one
//     burst of failures is one cut), after which it grows no further than
//     one below the concurrency that overloaded the receiver (raised by
//     one every floorWindow without an overload);
//   - a Retry-After pauses the whole endpoint, and so do overloads in a row
//     without a success (100 ms, doubling, up to pauseCap).
type Limiter struct {
	max int

	mu        sync.Mutex
	limit     float64
	inflight  int
	slowStart bool
	srtt      time.Duration
	floorCur  time.Duration // min of the current window
	floorPrev time.Duration // min of the previous window
	windowAt  time.Time
	lastCut   time.Time
	paused    time.Time // no request starts before
	strikes   int       // overloads in a row without a success
	// lastOverload is when the latest overload was reported: answers to
	// requests sent before it are the same burst (requests sent together
	// into one full accept queue), one strike however many they are.
	lastOverload time.Time
	overloads    int64
	// probe > 0: the limit is 1 for that many more successes, so the
	// floor is measured unloaded (with several in flight a queueing
	// receiver never shows its own latency); then it returns to saved.
	probe int
	saved float64
	// ceil is where growth stops: one below the requests in flight at the
	// lowest overload, raised by one every floorWindow without one. An overload
	// can cost a second (a dropped SYN), so the limit does not probe for
	// it again on every round trip.
	ceil               float64
	overloadedInWindow bool
	waiters            []chan struct{} // Acquire calls waiting, oldest first
	// onIdle runs when the last request in flight is done (WhenIdle).
	onIdle func()
}

// NewLimiter returns a limiter starting at initial (DefaultInitialLimit
// when ≤ 0) and never above max (DefaultMaxLimit when ≤ 0).
func NewLimiter(initial, max int) *Limiter {
	if max <= 0 {
		max = DefaultMaxLimit
	}
	if initial <= 0 {
		initial = DefaultInitialLimit
	}
	initial = min(initial, max)
	// It starts with a probe: the first answers of a cold receiver, several
	// at once, are slow (connection set-up, the receiver warming up), and
	// a floor taken from them would let the start grow far past what the
	// receiver takes.
	return &Limiter{max: max, limit: float64(initial), slowStart: true, windowAt: time.Now(),
		ceil: float64(max), probe: probeSamples, saved: float64(initial)}
}

// slowStartEnd is where doubling per round trip gives way to one more per
// round trip even without a sign of overload: latency does not show a
// full accept queue on a busy machine (a receiver starved of CPU is slow
// at any concurrency), and overshooting it drops a burst of connects.
const slowStartEnd = 16

// probeSamples is how many requests, one at a time, measure the floor at
// the start and every floorWindow.
const probeSamples = 3

// Max is the configured ceiling.
func (l *Limiter) Max() int { return l.max }

// Token is one admitted request; Done must be called exactly once.
type Token struct {
	l        *Limiter
	start    time.Time
	inflight int // in flight when admitted, this one included
}

// ErrWaitEnded is returned by Acquire when ctx ended before a slot freed.
var ErrWaitEnded = errors.New("receiver at capacity: not sent before the delivery ended")

// Acquire waits until the endpoint is not paused and fewer than the limit
// are in flight, or ctx ends.
func (l *Limiter) Acquire(ctx context.Context) (*Token, error) {
	var w chan struct{}
	for {
		l.mu.Lock()
		now := time.Now()
		wait := l.paused.Sub(now)
		if wait <= 0 && l.inflight < l.cur() {
			l.inflight++
			t := &Token{l: l, start: now, inflight: l.inflight}
			l.mu.Unlock()
			return t, nil
		}
		// Queue up: a freed slot wakes one waiter, not all of them (with
		// hundreds waiting, waking all on every answer cost more CPU than
		// the requests).
		if w == nil {
			w = make(chan struct{}, 1)
		}
		l.waiters = append(l.waiters, w)
		l.mu.Unlock()
		var (
			tm    *time.Timer
			timer <-chan time.Time
		)
		if wait > 0 {
			tm = time.NewTimer(wait)
			timer = tm.C
		}
		woken := false
		select {
		case <-ctx.Done():
		case <-w:
			woken = true
		case <-timer:
		}
		if tm != nil {
			tm.Stop()
		}
		if !woken {
			// wake takes a waiter off the queue and sends to it under
			// l.mu, so a woken one is not looked for in the queue: with
			// one POST per record hundreds wait, and every wait scanned
			// them all.
			l.mu.Lock()
			if !l.dropWaiter(w) {
				<-w // woken meanwhile: pass it on
				l.wake()
			}
			l.mu.Unlock()
		}
		if ctx.Err() != nil {
			return nil, ErrWaitEnded
		}
	}
}

// dropWaiter removes w from the queue and reports whether it was still
// there; l.mu is held.
func (l *Limiter) dropWaiter(w chan struct{}) bool {
	for i, x := range l.waiters {
		if x == w {
			l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
			return true
		}
	}
	return false
}

// cur is the whole number of requests allowed in flight.
func (l *Limiter) cur() int {
	if l.probe > 0 {
		return 1
	}
	return max(1, int(l.limit))
}

// wake wakes as many waiters as there are free slots (none while the
// endpoint is paused: their timers end the pause); l.mu is held.
func (l *Limiter) wake() {
	if time.Now().Before(l.paused) {
		return
	}
	for free := l.cur() - l.inflight; free > 0 && len(l.waiters) > 0; free-- {
		w := l.waiters[0]
		l.waiters = l.waiters[1:]
		w <- struct{}{}
	}
}

// Done reports the request's outcome. retryAfter > 0 (with Overload)
// pauses the endpoint for that long. It reports whether the limit was cut
// sharply (the caller may close idle connections beyond it).
func (t *Token) Done(sig Signal, retryAfter time.Duration) (cut bool) {
	l := t.l
	now := time.Now()
	rtt := now.Sub(t.start)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight--
	defer l.wake()
	if l.inflight == 0 && l.onIdle != nil {
		f := l.onIdle
		l.onIdle = nil
		f()
	}
	if now.Sub(l.windowAt) > floorWindow {
		l.floorPrev, l.floorCur, l.windowAt = l.floorCur, 0, now
		if l.probe == 0 {
			l.probe, l.saved = probeSamples, l.limit
		}
		if !l.overloadedInWindow {
			l.ceil = min(l.ceil+1, float64(l.max))
		}
		l.overloadedInWindow = false
	}
	switch sig {
	case Success:
		l.strikes = 0
		if l.probe > 0 {
			if t.inflight == 1 {
				if l.floorCur == 0 || rtt < l.floorCur {
					l.floorCur = rtt
				}
				if l.probe--; l.probe == 0 {
					l.limit = l.saved
				}
			}
			return
		}
		// Until a probe, any answer is the estimate.
		if (t.inflight == 1 || l.floor() == 0) && (l.floorCur == 0 || rtt < l.floorCur) {
			l.floorCur = rtt
		}
		if l.srtt == 0 {
			l.srtt = rtt
		} else {
			l.srtt += (rtt - l.srtt) / 8
		}
		target := 2*l.floor() + latencySlack
		switch {
		case rtt > 10*target:
			// A stall (a connect that waited for a SYN retransmit, a
			// receiver that froze) is as good as a timeout.
			return l.cut(now, 0.5)
		case rtt > 2*target:
			l.cut(now, 0.9)
		case rtt > target:
			// A queue is building: doubling on would overshoot it before
			// an overload shows (a connect dropped from a full accept
			// queue is only noticed when its connect times out), so
			// growth goes on one per round trip (HyStart's delay exit).
			l.slowStart = false
		case 2*t.inflight >= l.cur():
			// Only a limit in use earns growth.
			if l.slowStart && l.limit < slowStartEnd {
				l.limit++
			} else {
				l.limit += 1 / l.limit
			}
			l.limit = min(l.limit, l.ceil)
		}
	case Overload:
		l.overloads++
		if l.probe > 0 {
			l.probe, l.limit = 0, l.saved
		}
		cut = l.cut(now, 0.5)
		// Overloaded with n in flight: n-1 is what it takes. A retry
		// after (a 503 for a while) says nothing about concurrency.
		if retryAfter == 0 {
			l.ceil = min(l.ceil, max(2, float64(t.inflight-1)))
			l.overloadedInWindow = true
		}
		burst := t.start.Before(l.lastOverload)
		l.lastOverload = now
		switch {
		case retryAfter > 0:
			l.pause(now, min(retryAfter, maxRetryAfter))
			l.slowStart = true // back to doubling once the pause is over
		case !burst:
			// A second overload with no success in between (a receiver
			// that refuses every connection, or answers every request
			// with a 503) backs off the endpoint, not only the record:
			// 100 ms, doubling, up to pauseCap. A lone one (a connect
			// dropped from a full accept queue) is answered by the cut,
			// and so is a burst of them: only a request sent after the
			// previous overload was seen counts again (a dozen connects
			// dropped by one overshoot paused the endpoint for 100 ms
			// after the accept queue had long drained).
			if l.strikes++; l.strikes > 1 {
				l.pause(now, min(pauseBase<<min(l.strikes-2, 10), pauseCap))
			}
		}
	}
	return cut
}

// Congested reports an overload seen outside a request's answer (a
// connect that waited for a SYN retransmit): as an overload answer to a
// request sent with the current number in flight.
func (l *Limiter) Congested() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.overloads++
	l.cut(time.Now(), 0.5)
	l.ceil = min(l.ceil, max(2, float64(l.inflight-1)))
	l.overloadedInWindow = true
}

// cut multiplies the limit by f, at most once per round trip (one burst of
// failures from requests sent together is one signal).
func (l *Limiter) cut(now time.Time, f float64) bool {
	l.slowStart = false
	window := max(l.srtt, 50*time.Millisecond)
	if now.Sub(l.lastCut) < window {
		return false
	}
	l.lastCut = now
	l.limit = max(1, l.limit*f)
	return true
}

func (l *Limiter) pause(now time.Time, d time.Duration) {
	if until := now.Add(d); until.After(l.paused) {
		l.paused = until
		// Waiters queued before the pause have no timer of their own.
		time.AfterFunc(d, func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.wake()
		})
	}
}

// floor is the lowest round trip of the current and previous windows.
func (l *Limiter) floor() time.Duration {
	switch {
	case l.floorPrev == 0:
		return l.floorCur
	case l.floorCur == 0:
		return l.floorPrev
	}
	return min(l.floorCur, l.floorPrev)
}

// Stats returns a snapshot.
func (l *Limiter) Stats() LimiterStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := LimiterStats{Limit: l.cur(), Max: l.max, InFlight: l.inflight, RTT: l.srtt, Floor: l.floor(), Overloads: l.overloads}
	if d := time.Until(l.paused); d > 0 {
		s.PausedFor = d
	}
	return s
}

// roundMs is d in milliseconds with three decimals, for reports.
func roundMs(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}

// Millis returns the stats' RTT and Floor in milliseconds (three decimals).
func (s LimiterStats) Millis() (rtt, floor float64) { return roundMs(s.RTT), roundMs(s.Floor) }

// WhenIdle runs f once no request is in flight: at once if none is, else
// when the last one is Done (a later call replaces an f still waiting).
// No request is admitted while f runs. The webhook sink closes its idle
// connections this way after a cut: net/http's CloseIdleConnections can
// break a request under way on a connection it counts as idle
// ("transport connection broken: http: CloseIdleConnections called"),
// which made the receiver get that record twice.
func (l *Limiter) WhenIdle(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight == 0 {
		f()
		return
	}
	l.onIdle = f
}
