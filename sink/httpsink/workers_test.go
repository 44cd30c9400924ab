package httpsink

import (
	"sync"
	"sync/atomic"
	"testing"
)

// Every function handed to the workers runs, several at once (one waiting
// does not hold the others), a finished worker is reused rather than one
// started per function, and after close none is left while run still
// works.
func TestWorkersRunAllReuseAndClose(t *testing.T) {
	w := newWorkers()
	var ran atomic.Int64
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		w.run(func() { defer wg.Done(); <-release; ran.Add(1) })
	}
	close(release) // all eight were waiting at once, or this would hang
	wg.Wait()
	if got, want := w.alive(), 8; got != want {
		t.Fatalf("%d workers after 8 at once, want %d", got, want)
	}
	for range 100 {
		wg.Add(1)
		w.run(func() { defer wg.Done(); ran.Add(1) })
		wg.Wait()
	}
	// Reused: a new one starts only when the next function comes before
	// the worker that finished is back waiting, which is rare.
	if got := w.alive(); got > 8+10 {
		t.Errorf("%d workers after 100 more one at a time, want the 8 reused", got)
	}
	w.close()
	if got := w.alive(); got != 0 {
		t.Errorf("%d workers after close, want 0", got)
	}
	wg.Add(1)
	w.run(func() { defer wg.Done(); ran.Add(1) })
	wg.Wait()
	if got, want := ran.Load(), int64(109); got != want {
		t.Fatalf("ran %d, want %d", got, want)
	}
}
