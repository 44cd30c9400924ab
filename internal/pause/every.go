package pause

import (
	"context"
	"time"
)

// Every calls f every d, the first time after one d, until ctx ends
// (returning nil) or f fails (returning its error). It is the loop of
// cdcout's periodic work: heartbeats, watchers, samplers, the idle flush.
func Every(ctx context.Context, d time.Duration, f func() error) error {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := f(); err != nil {
			return err
		}
	}
}

// Repeat calls f at once and again after each wait f returns, until ctx
// ends: periodic work whose next turn depends on how this one went (a
// failure retries sooner).
func Repeat(ctx context.Context, f func() time.Duration) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(f())
	}
}
