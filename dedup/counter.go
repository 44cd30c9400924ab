package dedup

import (
	"container/list"
	"sync"
	"time"
)

// OccurrenceCounter numbers the sightings of each change digest, so two
// changes with byte-identical images (insert, delete, insert the same row)
// get different keys while two replicas looking at the same change get the
// same one.
//
// It is bounded on both axes, because a per-change map without a ceiling is
// an unbounded table in memory: an entry untouched for the window is
// forgotten, and beyond maxEntries the least recently seen digest is
// forgotten first.
//
// Time is the binlog EVENT time (source clock), never the replica's clock:
// replicas reading the same binlog then prune at the same points and agree
// on every occurrence. Next prunes by the time it is given, so the counter's
// state is a function of the event sequence alone.
//
// The window must be longer than a claim's lifetime in the database (the
// dedup window): if a claim outlived the counter entry that produced it, the
// next sighting of that digest would restart at occurrence 0, collide with
// the retained claim, and be dropped as a duplicate it is not.
//
// An OccurrenceCounter is safe for concurrent use.
type OccurrenceCounter struct {
	window     time.Duration
	maxEntries int

	mu      sync.Mutex
	entries map[string]*list.Element // digest → element of lru
	lru     *list.List               // of *occurrence, least recently seen first
}

type occurrence struct {
	digest string
	next   int       // the occurrence the next sighting gets
	last   time.Time // event time of the last sighting
}

// NewOccurrenceCounter returns an empty counter. maxEntries < 1 is treated
// as 1.
func NewOccurrenceCounter(window time.Duration, maxEntries int) *OccurrenceCounter {
	if maxEntries < 1 {
		maxEntries = 1
	}
	return &OccurrenceCounter{
		window:     window,
		maxEntries: maxEntries,
		entries:    make(map[string]*list.Element),
		lru:        list.New(),
	}
}

// Next records a sighting of digest at eventTime and returns its occurrence
// index, 0 for the first sighting inside the window.
func (c *OccurrenceCounter) Next(digest string, eventTime time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pruneLocked(eventTime)
	if el, ok := c.entries[digest]; ok {
		o := el.Value.(*occurrence)
		n := o.next
		o.next++
		if eventTime.After(o.last) {
			o.last = eventTime
		}
		c.lru.MoveToBack(el)
		return n
	}
	c.insertLocked(digest, 1, eventTime)
	return 0
}

// SeedFromChangeKeys aligns the counter with the claims already in the
// database: a process that starts mid-window would otherwise restart every
// digest at 0 and re-key changes the fleet has already keyed. Keys that are
// not digest keys are ignored. Call it once, before the first change is
// keyed, with the claims read in the same snapshot as the checkpoint the
// replica resumes from; now is the event time to treat them as last seen.
func (c *OccurrenceCounter) SeedFromChangeKeys(keys []string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		p, ok := ParseChangeKey(k)
		if !ok || p.Kind != KindDigest {
			continue
		}
		if el, ok := c.entries[p.A]; ok {
			o := el.Value.(*occurrence)
			if p.N+1 > o.next {
				o.next = p.N + 1
			}
			if now.After(o.last) {
				o.last = now
			}
			c.lru.MoveToBack(el)
			continue
		}
		c.insertLocked(p.A, p.N+1, now)
	}
}

// Prune forgets digests whose last sighting is more than the window before
// now (an event time).
func (c *OccurrenceCounter) Prune(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pruneLocked(now)
}

// Len is the number of digests remembered.
func (c *OccurrenceCounter) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

func (c *OccurrenceCounter) insertLocked(digest string, next int, t time.Time) {
	for len(c.entries) >= c.maxEntries {
		c.removeLocked(c.lru.Front())
	}
	c.entries[digest] = c.lru.PushBack(&occurrence{digest: digest, next: next, last: t})
}

// pruneLocked walks from the least recently seen end. Event times are
// nearly monotonic, so stopping at the first live entry costs at most a few
// entries kept a little past the window, and keeps Next O(1) amortised.
func (c *OccurrenceCounter) pruneLocked(now time.Time) {
	cutoff := now.Add(-c.window)
	for el := c.lru.Front(); el != nil; el = c.lru.Front() {
		if !el.Value.(*occurrence).last.Before(cutoff) {
			return
		}
		c.removeLocked(el)
	}
}

func (c *OccurrenceCounter) removeLocked(el *list.Element) {
	o := c.lru.Remove(el).(*occurrence)
	delete(c.entries, o.digest)
}
