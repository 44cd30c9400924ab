package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// fakeEnqueue is an enqueueStore of function fields; it records the
// checkpoints of the batches it was handed and how many were in flight at
// once. The outbox itself is tested against real servers (outbox, e2e);
// these tests are about the pipeline's order.
type fakeEnqueue struct {
	enqueue func(ctx context.Context, items []outbox.Pending, cp *outbox.Checkpoint) (outbox.EnqueueResult, error)

	mu       sync.Mutex
	calls    []string // checkpoint GTID sets ("-" for none), in call order
	inFlight int
	maxIn    int
}

func (f *fakeEnqueue) Enqueue(ctx context.Context, _ string, _ outbox.Fence, items []outbox.Pending, cp *outbox.Checkpoint) (outbox.EnqueueResult, error) {
	f.mu.Lock()
	name := "-"
	if cp != nil {
		name = cp.Pos.GTIDSet
	}
	f.calls = append(f.calls, name)
	f.inFlight++
	f.maxIn = max(f.maxIn, f.inFlight)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()
	return f.enqueue(ctx, items, cp)
}

func (f *fakeEnqueue) seen() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...), f.maxIn
}

func testEnqueuer(store enqueueStore) *enqueuer {
	return &enqueuer{store: store, log: zap.NewNop(), batchSize: 2, maxBuffer: 10, interval: time.Hour, lastRow: -1, pipeline: true}
}

func cpAt(gtid string) *outbox.Checkpoint {
	return &outbox.Checkpoint{Source: "enqueue/t", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: gtid}}
}

func pendingRow(n int) outbox.Pending {
	return outbox.Pending{Pipe: "i:db.t:s", Sink: "s", ChangeKey: "k", Change: &canonical.Change{Op: canonical.OpCreate, After: canonical.Row{"id": int64(n)}}}
}

// The handler goes on while a batch is written, the next batch waits for
// it, and batches reach the store one at a time in the order they were
// cut.
func TestEnqueuePipelineOneInFlight(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan string, 4)
	f := &fakeEnqueue{enqueue: func(_ context.Context, _ []outbox.Pending, cp *outbox.Checkpoint) (outbox.EnqueueResult, error) {
		entered <- cp.Pos.GTIDSet
		if cp.Pos.GTIDSet == "0-1-1" {
			<-release
		}
		return outbox.EnqueueResult{Records: 1}, nil
	}}
	q := testEnqueuer(f)
	ctx := t.Context()
	q.ready, q.cp = append(q.ready, pendingRow(1)), cpAt("0-1-1")
	if err := q.flush(ctx, q.cp); err != nil {
		t.Fatal(err)
	}
	if got := <-entered; got != "0-1-1" {
		t.Fatalf("first write %s", got)
	}
	// The first write is held; the handler is not.
	if q.cp != nil || len(q.ready) != 0 || q.inflight == nil {
		t.Fatalf("after cutting the batch: cp %v, %d ready, in flight %v", q.cp, len(q.ready), q.inflight != nil)
	}
	q.ready, q.cp = append(q.ready, pendingRow(2)), cpAt("0-1-2")
	second := make(chan error, 1)
	go func() { second <- q.flush(ctx, q.cp) }()
	select {
	case got := <-entered:
		t.Fatalf("batch %s written while the one before it was in flight", got)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if err := q.wait(ctx); err != nil {
		t.Fatal(err)
	}
	calls, maxIn := f.seen()
	if len(calls) != 2 || calls[0] != "0-1-1" || calls[1] != "0-1-2" || maxIn != 1 {
		t.Fatalf("store saw %v with up to %d in flight; want [0-1-1 0-1-2] one at a time", calls, maxIn)
	}
	if q.flushes != 2 || q.recordsWritten != 2 || q.inflight != nil {
		t.Fatalf("%d flushes, %d records written, in flight %v after both committed", q.flushes, q.recordsWritten, q.inflight != nil)
	}
}

// A write that fails for good (the lease was lost) fails every later
// flush, and nothing more reaches the store.
func TestEnqueuePipelineFailureIsSticky(t *testing.T) {
	f := &fakeEnqueue{enqueue: func(context.Context, []outbox.Pending, *outbox.Checkpoint) (outbox.EnqueueResult, error) {
		return outbox.EnqueueResult{}, outbox.ErrFenced
	}}
	q := testEnqueuer(f)
	ctx := t.Context()
	q.ready, q.cp = append(q.ready, pendingRow(1)), cpAt("0-1-1")
	if err := q.flush(ctx, q.cp); err != nil {
		t.Fatalf("cutting the first batch: %v", err)
	}
	q.ready, q.cp = append(q.ready, pendingRow(2)), cpAt("0-1-2")
	if err := q.flush(ctx, q.cp); !errors.Is(err, errLeaseLost) {
		t.Fatalf("flush after a fenced write = %v, want errLeaseLost", err)
	}
	if _, err := q.tick(ctx); !errors.Is(err, errLeaseLost) {
		t.Fatalf("tick after a fenced write = %v, want errLeaseLost", err)
	}
	if calls, _ := f.seen(); len(calls) != 1 {
		t.Fatalf("store called %v after the fenced write, want only the first", calls)
	}
}

// A graceful stop that cuts the write in flight short writes that batch
// again, then the transactions read after it, in order.
func TestEnqueuePipelineFinalWritesCutBatchFirst(t *testing.T) {
	var mu sync.Mutex
	committed := []string{}
	// The first write of 0-1-1 is held until the stop; the final's write
	// of it again commits. (Holding every write of 0-1-1 while its context
	// lived hung the final's, whenever the first had started before the
	// stop.)
	inFlight := make(chan struct{})
	f := &fakeEnqueue{enqueue: func(ctx context.Context, _ []outbox.Pending, cp *outbox.Checkpoint) (outbox.EnqueueResult, error) {
		mu.Lock()
		first := cp.Pos.GTIDSet == "0-1-1" && inFlight != nil
		if first {
			close(inFlight)
			inFlight = nil
		}
		mu.Unlock()
		if first {
			<-ctx.Done()
			return outbox.EnqueueResult{}, ctx.Err()
		}
		mu.Lock()
		committed = append(committed, cp.Pos.GTIDSet)
		mu.Unlock()
		return outbox.EnqueueResult{Records: 1}, nil
	}}
	q := testEnqueuer(f)
	stream, stop := context.WithCancel(t.Context())
	q.ready, q.cp = append(q.ready, pendingRow(1)), cpAt("0-1-1")
	held := inFlight
	if err := q.flush(stream, q.cp); err != nil {
		t.Fatal(err)
	}
	q.ready, q.cp = append(q.ready, pendingRow(2)), cpAt("0-1-2")
	<-held // the write is in flight when the stop comes
	stop()
	if err := q.final(t.Context()); err != nil {
		t.Fatalf("final: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(committed) != 2 || committed[0] != "0-1-1" || committed[1] != "0-1-2" {
		t.Fatalf("committed %v on stop, want [0-1-1 0-1-2]", committed)
	}
}

// Without the pipeline a flush returns once its batch committed.
func TestEnqueueWithoutPipelineWaits(t *testing.T) {
	f := &fakeEnqueue{enqueue: func(context.Context, []outbox.Pending, *outbox.Checkpoint) (outbox.EnqueueResult, error) {
		time.Sleep(20 * time.Millisecond) // a transaction that takes a while
		return outbox.EnqueueResult{Records: 1}, nil
	}}
	q := testEnqueuer(f)
	q.pipeline = false
	q.ready, q.cp = append(q.ready, pendingRow(1)), cpAt("0-1-1")
	if err := q.flush(t.Context(), q.cp); err != nil {
		t.Fatal(err)
	}
	if q.inflight != nil || q.flushes != 1 || q.recordsWritten != 1 {
		t.Fatalf("after flush: in flight %v, %d flushes, %d records", q.inflight != nil, q.flushes, q.recordsWritten)
	}
}
