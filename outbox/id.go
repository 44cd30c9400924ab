package outbox

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/google/uuid"
)

// ids is the process's one id source. It must be process-wide, not per
// Store: ids carry commit order only if every id this process hands out is
// greater than the one before, whichever component asked for it.
var ids idGenerator

// NewID returns a new outbox id: a UUIDv7 in its canonical text form,
// strictly greater (as bytes and as text) than every id this process
// returned before and than any floor set with RaiseIDFloor. The enqueuer
// calls it in commit order, so id order is commit order and the drainer can
// use it for per-key order.
func NewID() string { return ids.next().String() }

// raiseIDFloor makes every later NewID greater than id. A replica that takes
// over the enqueue lease calls it (through Store.RaiseIDFloor) with the
// newest id already in the outbox, so that a clock behind the previous
// leader's cannot give a later change of the same key a smaller id.
// Invalid ids are rejected.
func raiseIDFloor(id string) error {
	u, err := uuid.Parse(id)
	if err != nil {
		return fmt.Errorf("raise id floor: %w", err)
	}
	ids.raise(u)
	return nil
}

type idGenerator struct {
	mu   sync.Mutex
	last uuid.UUID
	// random buffers crypto/rand: one read per id (a system call or a
	// locked generator each time) was a fortieth of the enqueue's CPU.
	random *bufio.Reader
	// draws counts the ids drawn and the floors raised: a batch whose ids
	// were drawn ahead of its transaction keeps them only while it has
	// not moved (Store.PrepareBatch).
	draws uint64
}

func (g *idGenerator) next() uuid.UUID {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.nextLocked()
}

// drawFor gives every item its id, in item order, with no other draw in
// between (the lock is held throughout), and returns the count of draws
// after them: a batch whose ids were drawn ahead of its transaction may
// keep them only while that count has not moved (Store.PrepareBatch). Were
// another goroutine's draws to interleave (the batch before, retried), ids
// later than some of this batch's could commit before it, and the count
// would not tell.
func (g *idGenerator) drawFor(its []*pendingRecord) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, it := range its {
		it.id = g.nextLocked().String()
	}
	return g.draws
}

func (g *idGenerator) nextLocked() uuid.UUID {
	if g.random == nil {
		g.random = bufio.NewReaderSize(rand.Reader, 4096)
	}
	u := uuid.Must(uuid.NewV7FromReader(g.random))
	// uuid.NewV7 is monotonic within the process already; the floor is
	// what it does not know about.
	if bytes.Compare(u[:], g.last[:]) <= 0 {
		u = successor(g.last)
	}
	g.last = u
	g.draws++
	return u
}

// drawn is the count of ids drawn and floors raised so far.
func (g *idGenerator) drawn() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.draws
}

func (g *idGenerator) raise(u uuid.UUID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if bytes.Compare(u[:], g.last[:]) > 0 {
		g.last = u
	}
	g.draws++
}

// successor returns a UUIDv7 whose 48-bit millisecond time and 12-bit
// sequence, read as one 60-bit counter, is one more than u's, with fresh
// random bits after it: the smallest step that still sorts after u.
func successor(u uuid.UUID) uuid.UUID {
	t := uint64(u[0])<<52 | uint64(u[1])<<44 | uint64(u[2])<<36 | uint64(u[3])<<28 |
		uint64(u[4])<<20 | uint64(u[5])<<12 | uint64(u[6]&0x0f)<<8 | uint64(u[7])
	t++
	var n uuid.UUID
	_, _ = rand.Read(n[8:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	n[0] = byte(t >> 52)
	n[1] = byte(t >> 44)
	n[2] = byte(t >> 36)
	n[3] = byte(t >> 28)
	n[4] = byte(t >> 20)
	n[5] = byte(t >> 12)
	n[6] = 0x70 | byte(t>>8)&0x0f
	n[7] = byte(t)
	n[8] = n[8]&0x3f | 0x80 // RFC 9562 variant
	return n
}

// DerivedID is the id of a change a replay re-read from the binlog
// (engine/replay_binlog.go), its outbox record long deleted: a UUID of
// version 8 whose first 48 bits are the commit time in ms, as a UUIDv7's,
// and the rest a SHA-256 of key (sink and change). The same change gets
// the same id on every re-read; it is not the id the deleted record had.
func DerivedID(commitMs int64, key string) string {
	sum := sha256.Sum256([]byte(key))
	var u uuid.UUID
	ms := uint64(max(commitMs, 0))
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	copy(u[6:], sum[:10])
	u[6] = 0x80 | u[6]&0x0f // version 8
	u[8] = 0x80 | u[8]&0x3f // RFC 9562 variant
	return u.String()
}
