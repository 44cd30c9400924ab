package engine

import "time"

// handoffEntry is one observed change, waiting to be enqueued or already
// resolved.
type handoffEntry[T any] struct {
	// Pipe is "<instance>:<db.table>:<sink>".
	Pipe string
	// ChangeKey is the identity the entry will be claimed under, computed
	// when the change was observed, so re-draining it re-uses the same key
	// and collapses instead of duplicating.
	ChangeKey string
	Change    T
	// ObservedAt is the time the window is measured against.
	ObservedAt time.Time
	// Enqueued is set by the owner once the entry is resolved: enqueued by
	// this replica, or found already claimed by another.
	Enqueued bool
}

// handoffBuffer keeps the changes a standby replica observed, so that when
// it takes over the enqueue lease it can write them at once instead of
// re-reading the binlog. It is bounded by age (window) and by count
// (maxEntries, oldest dropped first): a write burst during a leadership gap
// costs bounded memory. Entries evicted before they were enqueued are counted
// in DroppedPending, the honest count of changes the buffer could not carry
// across a handoff.
//
// A handoffBuffer is not safe for concurrent use; its owner (the replica's
// stream loop) serialises access, which also makes setting Enqueued on an
// entry returned by NextPending safe.
type handoffBuffer[T any] struct {
	window     time.Duration
	maxEntries int

	entries []*handoffEntry[T] // observation order; live ones from head
	head    int
	// pending is an index at or before the oldest un-enqueued entry.
	pending        int
	droppedPending int64
}

// newHandoffBuffer returns an empty buffer. maxEntries < 1 is treated as 1.
func newHandoffBuffer[T any](window time.Duration, maxEntries int) *handoffBuffer[T] {
	if maxEntries < 1 {
		maxEntries = 1
	}
	return &handoffBuffer[T]{window: window, maxEntries: maxEntries}
}

// Len is the number of entries held, enqueued or not.
func (b *handoffBuffer[T]) Len() int { return len(b.entries) - b.head }

// DroppedPending counts entries evicted (by age or ceiling) while still
// un-enqueued.
func (b *handoffBuffer[T]) DroppedPending() int64 { return b.droppedPending }

// Append adds an entry, evicting the oldest if the buffer is full.
func (b *handoffBuffer[T]) Append(e handoffEntry[T]) {
	for b.Len() >= b.maxEntries {
		b.dropHead()
	}
	b.entries = append(b.entries, &e)
}

// NextPending returns the oldest entry still awaiting enqueue, or nil.
// Entries drain in observation order so outbox ids stay commit-ordered. The
// caller sets Enqueued on it once resolved; until then NextPending keeps
// returning it.
func (b *handoffBuffer[T]) NextPending() *handoffEntry[T] {
	b.advancePending()
	if b.pending < len(b.entries) {
		return b.entries[b.pending]
	}
	return nil
}

// Pending returns up to max of the oldest un-enqueued entries, in
// observation order, for a takeover that enqueues in batches.
func (b *handoffBuffer[T]) Pending(max int) []*handoffEntry[T] {
	b.advancePending()
	var out []*handoffEntry[T]
	for i := b.pending; i < len(b.entries) && len(out) < max; i++ {
		if !b.entries[i].Enqueued {
			out = append(out, b.entries[i])
		}
	}
	return out
}

// PendingCount is the number of entries not yet enqueued.
func (b *handoffBuffer[T]) PendingCount() int {
	b.advancePending()
	n := 0
	for i := b.pending; i < len(b.entries); i++ {
		if !b.entries[i].Enqueued {
			n++
		}
	}
	return n
}

// Prune forgets entries observed more than the window before now: enqueued
// ones silently, un-enqueued ones counted in DroppedPending.
func (b *handoffBuffer[T]) Prune(now time.Time) {
	cutoff := now.Add(-b.window)
	for b.head < len(b.entries) && b.entries[b.head].ObservedAt.Before(cutoff) {
		b.dropHead()
	}
}

func (b *handoffBuffer[T]) advancePending() {
	if b.pending < b.head {
		b.pending = b.head
	}
	for b.pending < len(b.entries) && b.entries[b.pending].Enqueued {
		b.pending++
	}
}

func (b *handoffBuffer[T]) dropHead() {
	e := b.entries[b.head]
	if !e.Enqueued {
		b.droppedPending++
	}
	b.entries[b.head] = nil // let the change be collected
	b.head++
	if b.head == len(b.entries) {
		b.entries, b.head, b.pending = b.entries[:0], 0, 0
		return
	}
	// Compact once the dead prefix is the larger half, so memory follows
	// the live entries and appends stay amortised O(1).
	if b.head > len(b.entries)/2 && b.head >= 64 {
		n := copy(b.entries, b.entries[b.head:])
		clear(b.entries[n:])
		b.entries = b.entries[:n]
		b.pending -= b.head
		if b.pending < 0 {
			b.pending = 0
		}
		b.head = 0
	}
}
