package outbox

import (
	"sync"
	"sync/atomic"
	"time"
)

// Recent keeps the payloads of the segments this process enqueued last,
// so that its own drainers, which usually deliver them moments later, read
// a segment's state from the database but not its payload again.
//
// Reading a payload back cost the server its pages once more and this
// process the bytes through the driver once more (BenchmarkSegmentRead,
// 1,000 realistic records a segment: 0.32–0.40 µs of the server's CPU a
// record from the table, 0.20–0.24 with the payload kept; this process
// 1.64–1.79 µs against 0.90–1.46; 1.5 ms a segment against 0.7–1.0). A segment's payload never changes once committed (its
// id is its first record's, drawn once; a retried transaction whose
// prepared segments no longer serve draws new ids), so a payload kept
// under its id, put only after its transaction committed, is the one in
// the table. The drainer still claims the segment with its conditional
// UPDATE and reads its columns; it only leaves out the payload when the
// row it reads is the one it holds (readSegment, readNext).
//
// Bounded by bytes: when full, newer segments are not kept (the drainer
// takes the oldest first, so those are the ones it needs next), and a
// segment kept for longer than recentMaxAge is dropped, so segments of
// pipes drained by another replica, which are never taken here, cannot
// fill it for good. A nil *Recent keeps nothing.
type Recent struct {
	mu    sync.Mutex
	limit int
	bytes int
	// byPipe holds each pipe's kept segments oldest first (a pipe's
	// segments are enqueued in id order); byID indexes them.
	byPipe map[string][]*recentSegment
	byID   map[string]*recentSegment
	now    func() time.Time

	hits atomic.Int64
}

// recentSegment is one kept segment.
type recentSegment struct {
	id, pipe string
	payload  []byte // compressed, as in the table; never written to
	at       time.Time
	gone     bool // taken or dropped (still queued until it reaches the front)
}

// recentMaxAge is how long a segment is kept for a drainer that has not
// taken it.
const recentMaxAge = 30 * time.Second

// DefaultRecentBytes bounds the payload bytes a Recent holds by default:
// about 8 segments of 1,000 realistic changes. While the drain keeps up a
// segment is read moments after its commit; more would only add to the
// peak heap, which GOGC=400 multiplies (at 4 MiB the 1,000,000-row
// transaction peaked at 209 MB in one run of two).
const DefaultRecentBytes = 2 << 20

// NewRecent returns a Recent holding up to limit payload bytes.
func NewRecent(limit int) *Recent {
	return &Recent{limit: limit, byPipe: map[string][]*recentSegment{}, byID: map[string]*recentSegment{}, now: time.Now}
}

// put keeps a committed segment's payload; payload must not be written to
// afterwards.
func (r *Recent) put(id, pipe string, payload []byte) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	r.pruneLocked(now)
	if r.bytes+len(payload) > r.limit || r.byID[id] != nil {
		return
	}
	s := &recentSegment{id: id, pipe: pipe, payload: payload, at: now}
	r.byPipe[pipe] = append(r.byPipe[pipe], s)
	r.byID[id] = s
	r.bytes += len(payload)
}

// pruneLocked drops segments kept longer than recentMaxAge and the taken
// ones at the front of each pipe's queue.
func (r *Recent) pruneLocked(now time.Time) {
	for pipe, q := range r.byPipe {
		i := 0
		for ; i < len(q); i++ {
			s := q[i]
			if !s.gone && now.Sub(s.at) < recentMaxAge {
				break
			}
			r.dropLocked(s)
		}
		switch {
		case i == len(q):
			delete(r.byPipe, pipe)
		case i > 0:
			r.byPipe[pipe] = append(q[:0], q[i:]...)
		}
	}
}

func (r *Recent) dropLocked(s *recentSegment) {
	if s.gone {
		return
	}
	s.gone = true
	delete(r.byID, s.id)
	r.bytes -= len(s.payload)
}

// get returns the kept segment of the pipe with the given id, or nil.
func (r *Recent) get(pipe, id string) *recentSegment {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.byID[id]; s != nil && s.pipe == pipe {
		return s
	}
	return nil
}

// next returns the oldest kept segment of the pipe whose id sorts after
// the given one, or nil: the segment a drainer reading ahead will most
// likely find next.
func (r *Recent) next(pipe, after string) *recentSegment {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.byPipe[pipe] {
		if !s.gone && s.id > after {
			return s
		}
	}
	return nil
}

// took forgets a segment the drainer read from memory: it is delivered
// from there once, and a second delivery (a retry after a lapsed claim)
// reads the table.
func (r *Recent) took(s *recentSegment) {
	if r == nil || s == nil {
		return
	}
	r.hits.Add(1)
	r.mu.Lock()
	r.dropLocked(s)
	r.pruneLocked(r.now())
	r.mu.Unlock()
}

// Hits is the number of segments drainers read from memory.
func (r *Recent) Hits() int64 {
	if r == nil {
		return 0
	}
	return r.hits.Load()
}

// Len is the number of segments kept and the bytes of their payloads.
func (r *Recent) Len() (segments, bytes int) {
	if r == nil {
		return 0, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byID), r.bytes
}
