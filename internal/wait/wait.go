// Package wait is the tests' one way to wait: poll a condition until it
// holds or a deadline passes, never a fixed sleep.
package wait

import (
	"context"
	"sync"
	"testing"
	"time"
)

// For polls cond until it reports done, and fails tb when timeout passes
// first, with what (cond's description of the state it saw last).
func For(tb testing.TB, timeout time.Duration, cond func() (done bool, what string)) {
	tb.Helper()
	// A poll every 10-50 ms: often enough for short waits, cheap for the
	// long ones whose conditions read the database.
	every := min(max(timeout/500, 10*time.Millisecond), 50*time.Millisecond)
	deadline := time.Now().Add(timeout)
	for {
		done, what := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s: %s", timeout, what)
		}
		time.Sleep(every)
	}
}

// Until is For with a fixed description: it fails tb with "timed out after
// <timeout> waiting for <what>".
func Until(tb testing.TB, what string, timeout time.Duration, cond func() bool) {
	tb.Helper()
	For(tb, timeout, func() (bool, string) { return cond(), "waiting for " + what })
}

// Background runs run in a goroutine until the returned stop is called or
// the test ends: stop cancels run's context and fails tb unless run
// returns nil within timeout. stop may be called more than once.
func Background(tb testing.TB, timeout time.Duration, run func(ctx context.Context) error) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("Run after cancel = %v, want nil", err)
				}
			case <-time.After(timeout):
				tb.Errorf("Run did not return within %v of the cancel", timeout)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
