package wait

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	Until(t, "the third poll", 5*time.Second, func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("polled %d times, want 3", n)
	}
}

// recorder is a testing.TB that records a Fatalf instead of stopping.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestForFailsWithTheLastState(t *testing.T) {
	r := &recorder{TB: t}
	polls := 0
	For(r, 30*time.Millisecond, func() (bool, string) {
		polls++
		if r.failed != "" {
			return true, "" // Fatalf returned (a real TB would have stopped)
		}
		return false, fmt.Sprintf("%d polls", polls)
	})
	if r.failed == "" || r.failed[:len("timed out after 30ms: ")] != "timed out after 30ms: " {
		t.Fatalf("failure %q, want a timeout with the last state", r.failed)
	}
}

func TestBackgroundStopsOnce(t *testing.T) {
	runs := 0
	stop := Background(t, time.Second, func(ctx context.Context) error {
		runs++
		<-ctx.Done()
		return nil
	})
	stop()
	stop()
	if runs != 1 {
		t.Fatalf("run ran %d times", runs)
	}
}
