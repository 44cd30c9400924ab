package pause

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	start := time.Now()
	if err := For(context.Background(), 20*time.Millisecond); err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("For = %v after %v, want nil after 20ms", err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if err := For(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
		t.Fatalf("For of an ended context = %v after %v, want Canceled at once", err, time.Since(start))
	}
}

func TestEvery(t *testing.T) {
	// f's error ends the loop and is returned, after the calls before it.
	calls := 0
	boom := errors.New("boom")
	start := time.Now()
	err := Every(context.Background(), 5*time.Millisecond, func() error {
		if calls++; calls == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || calls != 3 || time.Since(start) < 15*time.Millisecond {
		t.Fatalf("Every = %v after %d calls in %v, want boom after 3 calls and at least 15ms", err, calls, time.Since(start))
	}
	// An ended context ends it with nil, without a call.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls = 0
	if err := Every(ctx, time.Hour, func() error { calls++; return nil }); err != nil || calls != 0 {
		t.Fatalf("Every of an ended context = %v after %d calls, want nil and none", err, calls)
	}
}

func TestRepeat(t *testing.T) {
	// The first call is at once; each next one after the wait the call
	// before returned; an ended context stops it.
	ctx, cancel := context.WithCancel(context.Background())
	var at []time.Duration
	start := time.Now()
	Repeat(ctx, func() time.Duration {
		at = append(at, time.Since(start))
		if len(at) == 3 {
			cancel()
		}
		return time.Duration(len(at)) * 10 * time.Millisecond
	})
	if len(at) != 3 || at[0] > 5*time.Millisecond || at[1] < 10*time.Millisecond || at[2] < 30*time.Millisecond {
		t.Fatalf("calls at %v, want 3: at once, after 10ms, after 10+20ms", at)
	}
}
