package consumer

import (
	"container/list"
	"sync"
	"time"
)

// Dedup remembers the delivery ids processed within a window, bounded in
// entries, so that a redelivery (a retry after a lost answer, a second
// replica's attempt after a takeover) is dropped instead of processed
// again. Keep Window longer than cdcout's retry horizon for a record
// (max_attempts with the backoff cap): an id is forgotten after Window,
// or earlier when more than MaxEntries ids are younger than it.
//
// It is safe for concurrent use.
type Dedup struct {
	window time.Duration
	max    int
	now    func() time.Time

	mu    sync.Mutex
	seen  map[string]*list.Element
	order *list.List // of entry, oldest first
	// inflight are ids being processed now: a concurrent redelivery
	// waits for the first to finish rather than processing them twice.
	inflight map[string]chan struct{}
}

type entry struct {
	id string
	at time.Time
}

// NewDedup keeps ids for window, at most maxEntries of them (0 means no
// bound other than the window).
func NewDedup(window time.Duration, maxEntries int) *Dedup {
	return &Dedup{window: window, max: maxEntries, now: time.Now,
		seen: map[string]*list.Element{}, order: list.New(), inflight: map[string]chan struct{}{}}
}

// Do runs process for id unless id was processed within the window, and
// reports whether it ran. An id is remembered only when process returns
// nil, so a failed attempt is processed again on redelivery. A call for
// an id being processed by another goroutine waits for it first.
func (d *Dedup) Do(id string, process func() error) (ran bool, err error) {
	for {
		d.mu.Lock()
		d.expire()
		if _, ok := d.seen[id]; ok {
			d.mu.Unlock()
			return false, nil
		}
		wait, busy := d.inflight[id]
		if !busy {
			done := make(chan struct{})
			d.inflight[id] = done
			d.mu.Unlock()
			defer func() {
				d.mu.Lock()
				delete(d.inflight, id)
				if err == nil {
					d.remember(id)
				}
				d.mu.Unlock()
				close(done)
			}()
			return true, process()
		}
		d.mu.Unlock()
		<-wait
	}
}

// Seen reports whether id was processed within the window.
func (d *Dedup) Seen(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.expire()
	_, ok := d.seen[id]
	return ok
}

// Len is the number of ids remembered.
func (d *Dedup) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.expire()
	return len(d.seen)
}

func (d *Dedup) remember(id string) {
	d.seen[id] = d.order.PushBack(entry{id: id, at: d.now()})
	for d.max > 0 && d.order.Len() > d.max {
		d.drop(d.order.Front())
	}
}

func (d *Dedup) expire() {
	cut := d.now().Add(-d.window)
	for e := d.order.Front(); e != nil && !e.Value.(entry).at.After(cut); e = d.order.Front() {
		d.drop(e)
	}
}

func (d *Dedup) drop(e *list.Element) {
	delete(d.seen, e.Value.(entry).id)
	d.order.Remove(e)
}
