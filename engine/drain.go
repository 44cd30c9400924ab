package engine

import (
	"context"
	"database/sql"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/outbox"
)

// drainers runs one outbox.Drainer per pipe. Pipes are per table
// ("<instance>:<db.table>:<sink>") and tables appear while cdcout runs, so
// a drainer is started the first time a pipe gets rows (or at start, for
// pipes with undelivered rows) rather than from a fixed list.
type drainers struct {
	ctx    context.Context
	cancel context.CancelFunc
	db     *sql.DB
	store  *outbox.Store
	cfg    *config.Config
	holder string
	sinks  map[string]sinkEntry
	log    *zap.Logger
	// metrics observe every drainer's deliveries.
	metrics outbox.DrainMetrics
	// leases, when set, is the drain lease hook: a drainer claims rows
	// only while its pipe's lease is held. notify is told every pipe that
	// got rows (the drain leases learn pipes from it).
	leases func(pipe string) (lease.Lease, bool)
	notify func(pipes []string)
	// wakes is shared by every drainer: a pipe waiting for another pipe
	// of its sink (transaction records and changes, a RENAME) is woken
	// when that pipe's records are acknowledged.
	wakes *outbox.Wakes
	// recent keeps the payloads of the segments this process enqueued
	// (the enqueue's Store writes it), so the drainers do not read them
	// back from the database.
	recent *outbox.Recent

	mu      sync.Mutex
	byPipe  map[string]*outbox.Drainer
	skipped map[string]bool
	stopped bool
	wg      sync.WaitGroup
}

func newDrainers(ctx context.Context, db *sql.DB, cfg *config.Config, holder string, sinks map[string]sinkEntry, log *zap.Logger) *drainers {
	ctx, cancel := context.WithCancel(ctx)
	return &drainers{
		ctx: ctx, cancel: cancel, db: db, store: outbox.NewStore(db, cfg.StateDB, log), cfg: cfg, holder: holder, sinks: sinks, log: log,
		byPipe: map[string]*outbox.Drainer{}, skipped: map[string]bool{}, wakes: outbox.NewWakes(),
		recent: outbox.NewRecent(outbox.DefaultRecentBytes),
	}
}

// discover starts drainers for this instance's pipes that have rows to
// deliver from before this process started.
func (d *drainers) discover(ctx context.Context) error {
	pipes, err := d.pendingPipes(ctx)
	if err != nil {
		return err
	}
	d.written(pipes)
	return nil
}

// pendingPipes lists this instance's pipes with undelivered records.
func (d *drainers) pendingPipes(ctx context.Context) ([]string, error) {
	return d.store.PipesWithRecords(ctx, d.cfg.Instance+":", outbox.StatusPending)
}

// written wakes (starting if needed) the drainers of pipes that got rows.
func (d *drainers) written(pipes []string) { d.wake(pipes, (*outbox.Drainer).Wake) }

// segmentsWritten wakes (starting if needed) the segment loops of pipes
// an enqueue transaction wrote segments to (Drainer.WakeSegments).
func (d *drainers) segmentsWritten(pipes []string) { d.wake(pipes, (*outbox.Drainer).WakeSegments) }

// wake tells notify of pipes and wakes each pipe's drainer, started if
// needed, with wake.
func (d *drainers) wake(pipes []string, wake func(*outbox.Drainer)) {
	if d.notify != nil {
		d.notify(pipes)
	}
	for _, p := range pipes {
		if dr := d.ensure(p); dr != nil {
			wake(dr)
		}
	}
}

func (d *drainers) ensure(pipe string) *outbox.Drainer {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return nil
	}
	if dr, ok := d.byPipe[pipe]; ok {
		return dr
	}
	if d.skipped[pipe] {
		return nil
	}
	inst, _, sinkName, ok := outbox.SplitPipe(pipe)
	se, known := d.sinks[sinkName]
	if !ok || inst != d.cfg.Instance || !known {
		// Rows of a sink that is not configured stay pending: a deploy
		// that removed a sink before its rows drained must not lose them.
		d.skipped[pipe] = true
		d.log.Warn("pipe has rows but its sink is not configured; leaving them pending", zap.String("pipe", pipe))
		return nil
	}
	dr, err := outbox.NewDrainer(outbox.DrainerConfig{
		DB:         d.db,
		Schema:     d.cfg.StateDB,
		ClaimedBy:  d.holder,
		ClaimLease: d.cfg.ClaimLease,
		Pipes: map[string]outbox.PipeConfig{pipe: {
			Sink:        se.sink,
			Timeout:     se.cfg.Timeout,
			MaxAttempts: se.cfg.MaxAttempts,
			Concurrency: se.cfg.Concurrency,
			BatchSize:   se.cfg.BatchSize,
			// From the configuration: a sink without transactions reads
			// no BEGIN pipe per segment.
			Transactions: se.cfg.Transactions,
		}},
		Logger:  d.log,
		Metrics: d.metrics,
		Leases:  d.leases,
		Wakes:   d.wakes,
		Recent:  d.recent,
	})
	if err != nil {
		d.skipped[pipe] = true
		d.log.Error("start drainer", zap.String("pipe", pipe), zap.Error(err))
		return nil
	}
	d.byPipe[pipe] = dr
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := dr.Run(d.ctx); err != nil {
			d.log.Error("drainer stopped", zap.String("pipe", pipe), zap.Error(err))
		}
	}()
	return dr
}

// stopClaiming tells every drainer to stop claiming rows; deliveries in
// flight finish and record their outcomes.
func (d *drainers) stopClaiming() {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
	d.cancel()
}

// releaseOrphans returns rows and segments this process claimed but never
// handed to a sink (a claim whose read-back was cut off by the stop) to
// pending, and reports how many it released. It must only run once every
// drainer has returned (see outbox.Store.ReleaseClaimsOf).
func (d *drainers) releaseOrphans(ctx context.Context) (int64, error) {
	d.mu.Lock()
	pipes := make([]string, 0, len(d.byPipe))
	for p := range d.byPipe {
		pipes = append(pipes, p)
	}
	d.mu.Unlock()
	return d.store.ReleaseClaimsOf(ctx, d.holder, pipes)
}

// wait waits for the drainers to finish, at most timeout. It reports
// whether they did.
func (d *drainers) wait(timeout time.Duration) bool {
	done := make(chan struct{})
	go func() {
		d.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
