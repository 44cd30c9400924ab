package sink

import (
	"context"
	"testing"
	"time"
)

// done admits one request that took rtt and reports sig.
func done(t *testing.T, l *Limiter, rtt time.Duration, sig Signal, ra time.Duration) {
	t.Helper()
	tok, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tok.start = time.Now().Add(-rtt)
	tok.Done(sig, ra)
}

// simulate runs a receiver that serves one request at a time taking
// service each: with n in flight a request's round trip is n × service.
// It returns the limit after rounds round trips' worth of answers.
func simulate(t *testing.T, l *Limiter, service time.Duration, rounds int) int {
	t.Helper()
	for range rounds {
		n := l.Stats().Limit
		for _, tok := range acquire(t, l, n) {
			tok.start = time.Now().Add(-time.Duration(n) * service)
			tok.Done(Success, 0)
		}
		// Space the round trips so that cuts (once per round trip) can
		// happen in a test that runs faster than the simulated time.
		l.mu.Lock()
		l.lastCut = l.lastCut.Add(-time.Hour)
		l.mu.Unlock()
	}
	return l.Stats().Limit
}

// Against a receiver that serves one request at a time, queueing shows in
// the latency and the limit settles at a few (enough to keep it busy),
// far below the ceiling; against one whose latency does not grow, the
// limit reaches the ceiling.
func TestLimiterFollowsLatency(t *testing.T) {
	slow := NewLimiter(0, 64)
	if got := simulate(t, slow, 50*time.Millisecond, 200); got < 2 || got > 5 {
		t.Errorf("single-threaded 50 ms receiver: limit %d, want 2–5", got)
	}
	fast := NewLimiter(0, 64)
	for range 2000 + probeSamples {
		done(t, fast, 200*time.Microsecond, Success, 0)
	}
	// One request at a time is not a limit in use: no growth.
	if got := fast.Stats().Limit; got != DefaultInitialLimit {
		t.Errorf("one request at a time grew the limit to %d", got)
	}
	if got := simulate(t, fast, 20*time.Microsecond, 200); got != 64 {
		t.Errorf("fast receiver: limit %d, want the ceiling 64", got)
	}
}

// An overload halves the limit once per round trip, and a Retry-After
// pauses every request of the endpoint until it passed.
func TestLimiterOverloadCutsAndPauses(t *testing.T) {
	l := afterOverloadBurst(t, 32, 64, 2) // one burst: one cut
	if got := l.Stats().Limit; got != 16 {
		t.Fatalf("limit after one burst of overloads = %d, want 16", got)
	}
	l.mu.Lock()
	l.paused = time.Time{}
	l.mu.Unlock()
	done(t, l, time.Millisecond, Overload, 300*time.Millisecond)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(ctx); err != ErrWaitEnded {
		t.Fatalf("acquire during a Retry-After pause: %v, want ErrWaitEnded", err)
	}
	tok, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tok.Done(Success, 0)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("admitted %v after a 300 ms Retry-After", d)
	}
}

// A request waiting for a slot when the endpoint is paused is admitted
// when the pause ends, though no other request finishes to wake it.
func TestLimiterWaiterAdmittedAfterPause(t *testing.T) {
	l := NewLimiter(1, 1)
	l.probe = 0
	tok, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		w, err := l.Acquire(context.Background())
		if err != nil {
			t.Error(err)
			return
		}
		got <- time.Now()
		w.Done(Success, 0)
	}()
	for {
		l.mu.Lock()
		n := len(l.waiters)
		l.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	tok.Done(Overload, 100*time.Millisecond)
	select {
	case at := <-got:
		if d := at.Sub(start); d < 90*time.Millisecond {
			t.Fatalf("admitted %v into a 100 ms pause", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was never admitted after the pause")
	}
}

// TestWhenIdle: f runs at once with nothing in flight, else only when the
// request in flight is done, once; a later call replaces a waiting f.
func TestWhenIdle(t *testing.T) {
	l := NewLimiter(0, 0)
	var runs []string
	l.WhenIdle(func() { runs = append(runs, "idle") })
	if len(runs) != 1 {
		t.Fatalf("idle limiter: f ran %v, want once at once", runs)
	}
	tok, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	l.WhenIdle(func() { runs = append(runs, "first") })
	l.WhenIdle(func() { runs = append(runs, "second") })
	if len(runs) != 1 {
		t.Fatalf("with a request in flight f ran: %v", runs)
	}
	tok.Done(Success, 0)
	if len(runs) != 2 || runs[1] != "second" {
		t.Fatalf("after the last Done: %v, want [idle second]", runs)
	}
	done(t, l, time.Millisecond, Success, 0)
	if len(runs) != 2 {
		t.Fatalf("f ran again on a later request: %v", runs)
	}
}

// Overload answers to requests sent together (a burst of connects dropped
// from one full accept queue) are one signal: one cut and no pause; an
// overload of a request sent after the burst was seen, with no success
// in between, pauses the endpoint.
func TestLimiterOverloadBurstIsOneStrike(t *testing.T) {
	l := afterOverloadBurst(t, 16, 64, 12)
	if st := l.Stats(); st.PausedFor != 0 || st.Limit != 8 || st.Overloads != 12 {
		t.Fatalf("after one burst of 12 overloads: %+v, want limit 8, no pause", st)
	}
	done(t, l, 0, Overload, 0)
	if st := l.Stats(); st.PausedFor <= 0 {
		t.Fatalf("an overload sent after the burst, no success between: %+v, want a pause", st)
	}
}

// Answers slower than the latency target end the doubling: the limit goes
// on growing one per round trip, not one per answer.
func TestLimiterSlowStartEndsWhenLatencyRises(t *testing.T) {
	grow := func(queueing bool) int {
		l := NewLimiter(4, 64)
		l.probe = 0
		done(t, l, time.Millisecond, Success, 0) // the floor: target 5 ms
		for round := range 2 {
			for _, tok := range acquire(t, l, 4) {
				tok.start = time.Now().Add(-time.Millisecond)
				if round == 0 && queueing {
					tok.start = time.Now().Add(-7 * time.Millisecond)
				}
				tok.Done(Success, 0)
			}
		}
		return l.Stats().Limit
	}
	if got := grow(false); got != 8 {
		t.Errorf("answers at the floor: limit %d after two round trips from 4, want 8 (doubling)", got)
	}
	if got := grow(true); got > 5 {
		t.Errorf("a round trip above the target, then one at the floor: limit %d from 4, want at most 5 (one per round trip)", got)
	}
}

// afterOverloadBurst is a limiter (without probes) that has had n
// requests sent together all answered Overload.
func afterOverloadBurst(t *testing.T, initial, ceiling, n int) *Limiter {
	t.Helper()
	l := NewLimiter(initial, ceiling)
	l.probe = 0
	for _, tok := range acquire(t, l, n) {
		tok.Done(Overload, 0)
	}
	return l
}

// acquire takes n tokens of l at once, failing t if one cannot be had.
func acquire(t *testing.T, l *Limiter, n int) []*Token {
	t.Helper()
	var toks []*Token
	for range n {
		tok, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok)
	}
	return toks
}
