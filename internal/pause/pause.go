// Package pause holds the wait between retries that every retry loop of
// cdcout shares: it ends early, with the context's error, on a stop.
package pause

import (
	"context"
	"time"
)

// For waits d, or until ctx ends; it returns ctx.Err() in that case and
// nil after a full wait.
func For(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
