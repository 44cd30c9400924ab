package engine

import (
	"cmp"
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/internal/pause"
	"github.com/cdcout/cdcout/outbox"
)

// runwayEvery is how often the leader re-reads the binlog runway; the
// reading carries an absolute purge time, so the seconds shown in between
// stay exact. runwayRetry is the pace until the first reading.
const (
	runwayEvery = 30 * time.Second
	runwayRetry = 2 * time.Second
)

// runwayState is the last binlog runway reading of the leader's stream.
type runwayState struct {
	mu      sync.Mutex
	reading *binlog.Runway
	err     string
	logged  string        // the last error logged, so a lasting one is logged once
	every   time.Duration // runwayEvery unless a test sets it
}

func (r *runwayState) get() (*binlog.Runway, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reading, r.err
}

// watchRunway keeps e.runway current while ctx lasts: how long the
// source keeps the binlog file holding the checkpoint (binlog.Runway),
// read by the replica holding the enqueue lease, which is the one whose
// stream has the source's connection and whose checkpoint it is.
func (e *Engine) watchRunway(ctx context.Context, store *outbox.Store) {
	pause.Repeat(ctx, func() time.Duration {
		if e.readRunway(ctx, store) {
			return cmp.Or(e.runway.every, runwayEvery)
		}
		return runwayRetry
	})
}

// readRunway takes one reading; false when there is none to take yet (a
// standby, no checkpoint) or it failed.
func (e *Engine) readRunway(ctx context.Context, store *outbox.Store) bool {
	e.mu.Lock()
	st := e.stream
	e.mu.Unlock()
	set := func(r *binlog.Runway, err error) {
		e.runway.mu.Lock()
		defer e.runway.mu.Unlock()
		e.runway.reading, e.runway.err = r, ""
		if err != nil {
			e.runway.err = err.Error()
			if e.runway.err != e.runway.logged {
				e.log.Warn("read the binlog runway", zap.Error(err))
			}
		}
		e.runway.logged = e.runway.err
	}
	if st == nil {
		set(nil, nil)
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cp, err := store.LoadCheckpoint(rctx, e.leaseName)
	if err != nil || cp == nil {
		if ctx.Err() == nil && err != nil {
			set(nil, err)
		}
		return false
	}
	r, err := st.Runway(rctx, *cp)
	if err != nil {
		if ctx.Err() == nil {
			set(nil, err)
		}
		return false
	}
	set(&r, nil)
	return true
}
