package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/internal/pause"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/outbox"
)

// The enqueue pipeline. The enqueuer cuts a batch (its ready rows and, at a
// transaction boundary, the checkpoint after them) and hands it to a writer
// goroutine, then goes on reading and keying the next batch while the
// writer's database transaction runs: waiting for each commit in the
// stream's handler left the binlog reader idle for most of the time (30.5
// of 35.6 s in BenchmarkEndToEnd).
//
// The pipeline is on unless enqueue_pipeline is false; without it flush
// waits for the write it started, as the handler did before. Either way
// flush prepares the batch (outbox.Store.PrepareBatch: validated, keyed,
// its segments encoded) before it waits for room.
//
// Two batches are in flight at most (one without the pipeline, or in
// digest mode, or with a store that does not prepare batches). The second
// writes its claims and segments while the first runs, the database
// working on both, but advances its checkpoint and commits only after the
// first committed (outbox.Batch.After): with one transaction at a time the
// reader waited for the database's single session a quarter of the run
// (BenchmarkKafkaEndToEnd narrow) while a core was idle. So batches commit
// in stream order: outbox ids and segments follow commit order (a first
// batch retried after the second drew its ids makes the second retry with
// new ones), the checkpoint of a batch commits after the rows of every
// batch before it (invariant 1), and a batch whose predecessor did not
// commit does not commit either. A crash between the two commits leaves
// the second rolled back, its changes read again from the first's
// checkpoint. Digest mode keeps one batch in flight: its seeding counts
// the claims written up to the checkpoint's write, so a batch's claims
// must not be written before the checkpoint before it (see flushOpen).
// Each transaction is fenced by the lease as before, and the lease's local
// deadline is checked before every attempt. A failed write is sticky:
// every later flush returns its error, so nothing is written after a
// batch that was not.

// batch is one enqueue transaction: rows in stream order and, unless nil,
// the checkpoint after them.
type batch struct {
	items []outbox.Pending
	cp    *outbox.Checkpoint
	// hookMark is the watermark hook's Handed when the batch was cut:
	// the backfill chunks before it are in the outbox once it commits.
	hookMark int
	// prepared is the batch as a batchStore prepared it (or the error
	// that gave); nil for another store.
	prepared *outbox.Batch
	prepErr  error
	// done receives the write's outcome, for the handler (wait);
	// finished is closed when the write returned, lastID and err then
	// being its outcome, for the batch after it (outbox.Batch.After).
	done     chan writeOutcome
	finished chan struct{}
	lastID   string
	err      error
}

// committed is the outbox.Batch.After wait on b: the greatest id b drew
// once it committed, ErrPredecessor when it did not.
func (b *batch) committed(ctx context.Context) (string, error) {
	select {
	case <-b.finished:
		if b.err != nil {
			return "", fmt.Errorf("%w: %v", outbox.ErrPredecessor, b.err)
		}
		return b.lastID, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// writeOutcome is what the writer reports of one batch.
type writeOutcome struct {
	b    *batch
	res  outbox.EnqueueResult
	err  error
	took time.Duration // inside Store.Enqueue, retries included
}

// flush cuts ready (with cp; nil: no checkpoint move) into a batch and
// starts its write, after the write in flight, if any, has committed.
func (q *enqueuer) flush(ctx context.Context, cp *outbox.Checkpoint) error {
	if q.failed != nil {
		return q.failed
	}
	// Prepared while the write in flight runs: validating, keying and
	// encoding the segments was a third of the writer's time in each
	// transaction (BenchmarkFileEndToEnd's profile). q.ready stays as it
	// is until the batch is cut, so a failed wait leaves it buffered.
	var prepared *outbox.Batch
	var prepErr error
	if bs, ok := q.store.(batchStore); ok {
		prepared, prepErr = bs.PrepareBatch(q.ready, cp)
	}
	if err := q.room(ctx); err != nil {
		return err
	}
	b := &batch{items: q.ready, cp: cp, prepared: prepared, prepErr: prepErr}
	if prepared != nil {
		if n := len(q.inflight); n > 0 {
			prepared.After(q.inflight[n-1].committed)
		}
		prepared.Seal()
	}
	if q.hook != nil {
		b.hookMark = q.hook.Handed()
	}
	q.ready, q.spare = q.spare[:0], nil
	if cp == q.cp {
		q.cp = nil
		q.since = time.Time{}
	}
	q.start(ctx, b)
	if !q.pipeline {
		return q.wait(ctx)
	}
	return nil
}

// start writes b in the background; its outcome arrives on b.done.
func (q *enqueuer) start(ctx context.Context, b *batch) {
	b.done, b.finished = make(chan writeOutcome, 1), make(chan struct{})
	q.inflight = append(q.inflight, b)
	go func() {
		w := q.write(ctx, b)
		if b.prepared != nil {
			// The wait holds the batch before, which held the one before
			// it: kept, the chain held every batch of the tenure.
			b.prepared.After(nil)
		}
		b.lastID, b.err = w.res.LastID, w.err
		close(b.finished)
		b.done <- w
	}()
}

// maxInflight is how many batches may be written at once (see above).
func (q *enqueuer) maxInflight() int {
	if _, ok := q.store.(batchStore); !ok || !q.pipeline || q.digestMode {
		return 1
	}
	return 2
}

// room waits until another batch may start: for the oldest write in
// flight while the most that may be are.
func (q *enqueuer) room(ctx context.Context) error {
	if q.failed != nil {
		return q.failed
	}
	for len(q.inflight) >= q.maxInflight() {
		if err := q.waitOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// wait collects every write in flight: it returns once each committed or
// one failed (the writer gives up when ctx ends).
func (q *enqueuer) wait(ctx context.Context) error {
	if q.failed != nil {
		return q.failed
	}
	for len(q.inflight) > 0 {
		if err := q.waitOldest(ctx); err != nil {
			return err
		}
	}
	return nil
}

// waitOldest collects the oldest write in flight.
func (q *enqueuer) waitOldest(ctx context.Context) error {
	t0 := time.Now()
	w := <-q.inflight[0].done
	q.waitTime += time.Since(t0)
	return q.finish(ctx, w)
}

// poll collects the writes that have finished, oldest first, without
// waiting for one that has not.
func (q *enqueuer) poll(ctx context.Context) error {
	if q.failed != nil {
		return q.failed
	}
	for len(q.inflight) > 0 {
		select {
		case w := <-q.inflight[0].done:
			if err := q.finish(ctx, w); err != nil {
				return err
			}
		default:
			return nil
		}
	}
	return nil
}

// finish takes a write's outcome on the handler's side (under q.mu): the
// counters, the backfill chunks now done, the batch's slice for reuse.
// A failed write fails the ones after it (they do not commit), so they
// are collected with it.
func (q *enqueuer) finish(ctx context.Context, w writeOutcome) error {
	q.inflight[0] = nil
	q.inflight = q.inflight[1:]
	q.flushTime += w.took
	if w.err != nil {
		if q.failed == nil {
			q.failed = w.err
		}
		if errors.Is(w.err, context.Canceled) || errors.Is(w.err, context.DeadlineExceeded) || (q.unsent != nil && errors.Is(w.err, outbox.ErrPredecessor)) {
			// Cut short by the tenure's end (or after one that was): a
			// graceful stop writes it again (final), ahead of what was
			// read after it.
			q.unsent = append(q.unsent, w.b)
		}
		for len(q.inflight) > 0 {
			_ = q.finish(ctx, <-q.inflight[0].done)
		}
		return q.failed
	}
	q.recordsWritten += int64(w.res.Records)
	q.flushes++
	if q.hook != nil {
		q.hook.Written(ctx, w.b.hookMark)
	}
	clear(w.b.items)
	q.spare = w.b.items[:0]
	return nil
}

// write runs one batch's enqueue transaction on the writer goroutine.
// Transient database errors are retried until ctx ends; a fenced write
// ends the tenure. It touches only what does not change after the
// enqueuer is built, and the callbacks that are safe from any goroutine
// (the drainers' wake-up above all: it must not wait for the next batch).
func (q *enqueuer) write(ctx context.Context, b *batch) writeOutcome {
	w := writeOutcome{b: b}
	backoff := 100 * time.Millisecond
	for {
		if q.valid != nil && !q.valid() {
			w.err = fmt.Errorf("%w: local deadline passed without a renewal", errLeaseLost)
			return w
		}
		t0 := time.Now()
		var res outbox.EnqueueResult
		var err error
		switch {
		case b.prepErr != nil:
			err = b.prepErr
		case b.prepared != nil:
			res, err = q.store.(batchStore).EnqueueBatch(ctx, q.claimedBy, q.fence, b.prepared)
		default:
			res, err = q.store.Enqueue(ctx, q.claimedBy, q.fence, b.items, b.cp)
		}
		w.took += time.Since(t0)
		if q.report != nil && ctx.Err() == nil {
			q.report(err)
		}
		if err == nil {
			w.res = res
			if q.observe != nil {
				q.observe(res)
			}
			if len(res.Pipes) > 0 && q.written != nil {
				q.written(res.Pipes)
			}
			return w
		}
		if errors.Is(err, outbox.ErrFenced) || errors.Is(err, lease.ErrNotHeld) {
			w.err = fmt.Errorf("%w: %v", errLeaseLost, err)
			return w
		}
		if errors.Is(err, outbox.ErrPredecessor) {
			w.err = err // the batch before failed; its error is the one told
			return w
		}
		if ctx.Err() != nil {
			w.err = ctx.Err()
			return w
		}
		q.log.Warn("enqueue failed; retrying", zap.Error(err), zap.Int("rows", len(b.items)), zap.Duration("backoff", backoff))
		if err := pause.For(ctx, backoff); err != nil {
			w.err = err
			return w
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// final writes what is still buffered on a graceful stop: a batch whose
// write the stop cut short, then the complete transactions read after it,
// with their checkpoint. The open transaction's rows are dropped: it will
// be read again from the checkpoint.
func (q *enqueuer) final(ctx context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.open = q.open[:0]
	if err := q.wait(ctx); err != nil && q.unsent == nil {
		return err
	}
	if unsent := q.unsent; unsent != nil {
		q.unsent, q.failed = nil, nil
		for _, b := range unsent { // one after the other (start dropped their waits)
			q.start(ctx, b)
			if err := q.wait(ctx); err != nil {
				return err
			}
		}
	}
	if q.cp == nil && len(q.ready) == 0 {
		return nil
	}
	if err := q.flush(ctx, q.cp); err != nil {
		return err
	}
	return q.wait(ctx)
}

// stop waits for the write in flight (the tenure ends: its ctx is over,
// so the writer gives up soon). A batch that committed still marks its
// backfill chunks done, within a few seconds.
func (q *enqueuer) stop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.inflight) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for len(q.inflight) > 0 { // a failed one collects the rest itself
			_ = q.finish(ctx, <-q.inflight[0].done)
		}
	}
}
