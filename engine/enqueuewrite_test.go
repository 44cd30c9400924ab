package engine

import (
	"context"
	"errors"
	"fmt"
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
	if q.cp != nil || len(q.ready) != 0 || len(q.inflight) != 1 {
		t.Fatalf("after cutting the batch: cp %v, %d ready, %d in flight", q.cp, len(q.ready), len(q.inflight))
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
	if q.flushes != 2 || q.recordsWritten != 2 || len(q.inflight) != 0 {
		t.Fatalf("%d flushes, %d records written, %d in flight after both committed", q.flushes, q.recordsWritten, len(q.inflight))
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
	if len(q.inflight) != 0 || q.flushes != 1 || q.recordsWritten != 1 {
		t.Fatalf("after flush: %d in flight, %d flushes, %d records", len(q.inflight), q.flushes, q.recordsWritten)
	}
}

// fakeBatchStore is a batchStore whose writes the test holds and
// releases one by one; it records how many were in flight at once.
type fakeBatchStore struct {
	fakeEnqueue
	mu      sync.Mutex
	cps     map[*outbox.Batch]*outbox.Checkpoint
	release map[string]chan error // by checkpoint GTID set
	entered chan string
}

func (f *fakeBatchStore) PrepareBatch(items []outbox.Pending, cp *outbox.Checkpoint) (*outbox.Batch, error) {
	b := &outbox.Batch{}
	f.mu.Lock()
	f.cps[b] = cp
	f.mu.Unlock()
	return b, nil
}

func (f *fakeBatchStore) EnqueueBatch(ctx context.Context, _ string, _ outbox.Fence, b *outbox.Batch) (outbox.EnqueueResult, error) {
	f.mu.Lock()
	cp := f.cps[b]
	ch := f.release[cp.Pos.GTIDSet]
	f.mu.Unlock()
	f.fakeEnqueue.mu.Lock()
	f.inFlight++
	f.maxIn = max(f.maxIn, f.inFlight)
	f.calls = append(f.calls, cp.Pos.GTIDSet)
	f.fakeEnqueue.mu.Unlock()
	defer func() {
		f.fakeEnqueue.mu.Lock()
		f.inFlight--
		f.fakeEnqueue.mu.Unlock()
	}()
	f.entered <- cp.Pos.GTIDSet
	select {
	case err := <-ch:
		return outbox.EnqueueResult{Records: 1}, err
	case <-ctx.Done():
		return outbox.EnqueueResult{}, ctx.Err()
	}
}

// With a store that prepares batches, two are written at once and a third
// waits for the first; outcomes are collected oldest first, and one that
// failed fails the rest.
func TestEnqueuePipelineTwoInFlight(t *testing.T) {
	f := &fakeBatchStore{cps: map[*outbox.Batch]*outbox.Checkpoint{}, release: map[string]chan error{}, entered: make(chan string, 8)}
	for _, g := range []string{"0-1-1", "0-1-2", "0-1-3", "0-1-4"} {
		f.release[g] = make(chan error, 1)
	}
	q := testEnqueuer(f)
	ctx := t.Context()
	cut := func(n int) error {
		q.ready, q.cp = append(q.ready, pendingRow(n)), cpAt(fmt.Sprint("0-1-", n))
		return q.flush(ctx, q.cp)
	}
	for n := 1; n <= 2; n++ {
		if err := cut(n); err != nil {
			t.Fatal(err)
		}
		<-f.entered
	}
	if len(q.inflight) != 2 {
		t.Fatalf("%d batches in flight, want 2", len(q.inflight))
	}
	third := make(chan error, 1)
	go func() { third <- cut(3) }()
	select {
	case g := <-f.entered:
		t.Fatalf("batch %s started with two in flight", g)
	case <-time.After(100 * time.Millisecond):
	}
	f.release["0-1-1"] <- nil
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	if g := <-f.entered; g != "0-1-3" {
		t.Fatalf("started %s, want 0-1-3", g)
	}
	if q.flushes != 1 {
		t.Fatalf("%d batches collected, want the first", q.flushes)
	}
	// The second fails for good: the third (the store fails it too, as
	// outbox.Batch.After does) is collected with it, and no batch starts.
	f.release["0-1-2"] <- outbox.ErrFenced
	f.release["0-1-3"] <- fmt.Errorf("%w: fenced", outbox.ErrPredecessor)
	if err := cut(4); !errors.Is(err, errLeaseLost) {
		t.Fatalf("flush after a fenced batch = %v, want errLeaseLost", err)
	}
	if len(q.inflight) != 0 || q.flushes != 1 {
		t.Fatalf("%d in flight, %d collected after the failure; want 0 and 1", len(q.inflight), q.flushes)
	}
	if calls, maxIn := f.seen(); len(calls) != 3 || maxIn != 2 {
		t.Fatalf("store saw %v, up to %d at once; want 3 batches, 2 at once", calls, maxIn)
	}
}

// A graceful stop that cuts both writes in flight short writes them
// again in order, then what was read after them.
func TestEnqueuePipelineFinalWritesBothCutBatches(t *testing.T) {
	f := &fakeBatchStore{cps: map[*outbox.Batch]*outbox.Checkpoint{}, release: map[string]chan error{}, entered: make(chan string, 8)}
	for _, g := range []string{"0-1-1", "0-1-2", "0-1-3"} {
		f.release[g] = make(chan error, 1)
	}
	q := testEnqueuer(f)
	stream, stop := context.WithCancel(t.Context())
	for n := 1; n <= 2; n++ {
		q.ready, q.cp = append(q.ready, pendingRow(n)), cpAt(fmt.Sprint("0-1-", n))
		if err := q.flush(stream, q.cp); err != nil {
			t.Fatal(err)
		}
		<-f.entered
	}
	q.ready, q.cp = append(q.ready, pendingRow(3)), cpAt("0-1-3")
	stop()
	for { // both writes gave up before the store lets any through
		f.fakeEnqueue.mu.Lock()
		n := f.inFlight
		f.fakeEnqueue.mu.Unlock()
		if n == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for _, g := range []string{"0-1-1", "0-1-2", "0-1-3"} {
		f.release[g] <- nil
	}
	if err := q.final(t.Context()); err != nil {
		t.Fatalf("final: %v", err)
	}
	calls, _ := f.seen()
	if got := fmt.Sprint(calls); got != "[0-1-1 0-1-2 0-1-1 0-1-2 0-1-3]" {
		t.Fatalf("store saw %s, want both cut batches, again in order, then 0-1-3", got)
	}
	if q.flushes != 3 {
		t.Fatalf("%d batches committed, want 3", q.flushes)
	}
}
