// Package wait is the tests' one way to wait: poll a condition until it
// holds or a deadline passes, never a fixed sleep.
package wait

import (
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
