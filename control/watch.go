package control

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/internal/pause"
)

// watchEvery is how often a Watcher reads the paused sinks: a pause or
// resume takes effect on every replica within about this.
const watchEvery = time.Second

// Watcher is one replica's view of its instance's paused sinks, read
// from the state database every watchEvery. A read that fails keeps the
// last state read in force.
type Watcher struct {
	db               *sql.DB
	schema, instance string
	log              *zap.Logger
	resumed          func(sink string)

	mu     sync.RWMutex
	paused map[string]bool

	stop func()
}

// Watch reads the paused sinks once — a replica that starts must not
// deliver a paused sink's records before it has looked — and then every
// watchEvery until Stop. resumed (may be nil) is told each sink that
// stopped being paused.
func Watch(ctx context.Context, db *sql.DB, schema, instance string, log *zap.Logger, resumed func(sink string)) (*Watcher, error) {
	w := &Watcher{db: db, schema: schema, instance: instance, log: log, resumed: resumed}
	if err := w.refresh(ctx); err != nil && ctx.Err() == nil {
		return nil, err // "read sink controls: …"
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		failing := false
		_ = pause.Every(rctx, watchEvery, func() error {
			err := w.refresh(rctx)
			if err != nil && !failing && rctx.Err() == nil {
				w.log.Warn("read paused sinks; keeping the last state read", zap.Error(err))
			}
			failing = err != nil
			return nil
		})
	}()
	w.stop = func() { cancel(); <-done }
	return w, nil
}

// Stop ends the reads and waits for them.
func (w *Watcher) Stop() { w.stop() }

func (w *Watcher) refresh(ctx context.Context) error {
	now, err := Paused(ctx, w.db, w.schema, w.instance)
	if err != nil {
		return err
	}
	w.mu.Lock()
	before := w.paused
	w.paused = now
	w.mu.Unlock()
	for sink := range now {
		if before != nil && !before[sink] {
			w.log.Info("sink paused: its pipes are not delivered until it is resumed", zap.String("sink", sink))
		}
	}
	for sink := range before {
		if !now[sink] {
			w.log.Info("sink resumed", zap.String("sink", sink))
			if w.resumed != nil {
				w.resumed(sink)
			}
		}
	}
	return nil
}

// IsPaused reports whether sink is paused, as last read.
func (w *Watcher) IsPaused(sink string) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.paused[sink]
}
