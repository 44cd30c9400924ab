package engine

import (
	"fmt"
	"testing"
	"time"
)

// bufT0 is the buffer tests' clock origin.
var bufT0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func bufEntry(i int, at time.Time) handoffEntry[int] {
	return handoffEntry[int]{Pipe: "i:db.t:s", ChangeKey: fmt.Sprint("g:0-1-", i, ":0"), Change: i, ObservedAt: at}
}

func TestHandoffBufferDrainsInOrder(t *testing.T) {
	b := newHandoffBuffer[int](time.Minute, 100)
	for i := 0; i < 5; i++ {
		b.Append(bufEntry(i, bufT0))
	}
	if got, want := b.PendingCount(), 5; got != want {
		t.Fatalf("PendingCount = %d, want %d", got, want)
	}
	for want := 0; want < 5; want++ {
		e := b.NextPending()
		if e == nil || e.Change != want {
			t.Fatalf("NextPending = %+v, want change %d", e, want)
		}
		// Not marked yet: the same entry comes back.
		if again := b.NextPending(); again != e {
			t.Fatalf("NextPending moved on before the entry was resolved")
		}
		e.Enqueued = true
	}
	if e := b.NextPending(); e != nil {
		t.Fatalf("NextPending after all enqueued = %+v", e)
	}
	if got := b.Len(); got != 5 {
		t.Fatalf("Len = %d, want 5 (enqueued entries stay until pruned)", got)
	}
}

func TestHandoffBufferPendingBatch(t *testing.T) {
	b := newHandoffBuffer[int](time.Minute, 100)
	for i := 0; i < 10; i++ {
		b.Append(bufEntry(i, bufT0))
	}
	b.Pending(100)[3].Enqueued = true // resolved out of order
	got := b.Pending(4)
	if len(got) != 4 || got[0].Change != 0 || got[3].Change != 4 {
		t.Fatalf("Pending(4) = %v", changes(got))
	}
	if got, want := b.PendingCount(), 9; got != want {
		t.Fatalf("PendingCount = %d, want %d", got, want)
	}
}

func changes(es []*handoffEntry[int]) []int {
	var out []int
	for _, e := range es {
		out = append(out, e.Change)
	}
	return out
}

func TestHandoffBufferCeilingCountsDroppedPending(t *testing.T) {
	b := newHandoffBuffer[int](time.Hour, 3)
	b.Append(bufEntry(0, bufT0))
	b.NextPending().Enqueued = true
	for i := 1; i <= 5; i++ {
		b.Append(bufEntry(i, bufT0))
	}
	// 0 (enqueued) and 1, 2 (pending) were evicted.
	if got, want := b.Len(), 3; got != want {
		t.Fatalf("Len = %d, want %d", got, want)
	}
	if got, want := b.DroppedPending(), int64(2); got != want {
		t.Fatalf("DroppedPending = %d, want %d", got, want)
	}
	if e := b.NextPending(); e == nil || e.Change != 3 {
		t.Fatalf("NextPending = %+v, want 3", e)
	}
}

func TestHandoffBufferPruneByAge(t *testing.T) {
	b := newHandoffBuffer[int](10*time.Second, 100)
	for i := 0; i < 6; i++ {
		b.Append(bufEntry(i, bufT0.Add(time.Duration(i)*time.Second)))
	}
	b.NextPending().Enqueued = true // 0
	b.Prune(bufT0.Add(13500 * time.Millisecond))
	// 0..3 are older than 10 s; 0 was enqueued, 1..3 were not.
	if got, want := b.Len(), 2; got != want {
		t.Fatalf("Len = %d, want %d", got, want)
	}
	if got, want := b.DroppedPending(), int64(3); got != want {
		t.Fatalf("DroppedPending = %d, want %d", got, want)
	}
	if e := b.NextPending(); e == nil || e.Change != 4 {
		t.Fatalf("NextPending = %+v, want 4", e)
	}
	b.Prune(bufT0.Add(time.Hour))
	if b.Len() != 0 || b.NextPending() != nil {
		t.Fatalf("buffer not empty after pruning everything")
	}
}

// Long runs of append/resolve/prune keep memory bounded and order intact
// across compactions.
func TestHandoffBufferSteadyState(t *testing.T) {
	b := newHandoffBuffer[int](time.Second, 1000)
	next := 0
	for i := 0; i < 100_000; i++ {
		at := bufT0.Add(time.Duration(i) * time.Millisecond)
		b.Append(bufEntry(i, at))
		if i%3 == 0 {
			for j := 0; j < 3; j++ {
				e := b.NextPending()
				if e == nil {
					break
				}
				if e.Change != next {
					t.Fatalf("drained %d, want %d", e.Change, next)
				}
				next++
				e.Enqueued = true
			}
		}
		b.Prune(at)
		if b.Len() > 1001 {
			t.Fatalf("Len = %d", b.Len())
		}
	}
	if cap(b.entries) > 4096 {
		t.Fatalf("backing array grew to %d", cap(b.entries))
	}
	if b.DroppedPending() != 0 {
		t.Fatalf("DroppedPending = %d, want 0", b.DroppedPending())
	}
}
