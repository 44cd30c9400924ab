package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/pause"
)

// bufEvent is one event a standby observed: a row change, or the commit
// that ends a transaction. A standby keeps whole transactions only; their
// rows are appended together with their commit.
type bufEvent struct {
	seq    int64
	change *canonical.Change
	commit *binlog.Commit
	// gap marks the commit of a transaction whose rows were too many to
	// keep: nothing before it can be carried across a handoff.
	gap bool
}

type commitMark struct {
	seq int64
	pos binlog.Position
}

// handoff is a standby's view of the stream: the transactions it observed
// since its stream started, in a handoffBuffer bounded by age and
// count (rows plus commits). When the standby takes the enqueue lease it
// asks after(checkpoint): if the buffer holds every transaction after the
// checkpoint, those are enqueued at once (through the same path a re-read
// takes, so claims and the digest-mode counter treat them exactly like a
// re-read) and the new leader's stream continues where the standby's
// stopped; otherwise the leader re-reads the binlog from the checkpoint.
// Either way nothing is lost while the binlog still has it.
//
// Entries at or before the latest checkpoint are marked enqueued (the
// leader wrote them), so DroppedPending counts only what the buffer could
// not carry.
type handoff struct {
	max int

	mu       sync.Mutex
	buf      *handoffBuffer[bufEvent]
	appended int64 // entries ever appended: the next entry's seq
	// started is set once the stream opened at start: the buffer then
	// holds every transaction after start until an entry is evicted.
	started bool
	start   binlog.Position
	// commits are the commit entries still held, plus the last evicted
	// one (the base a takeover can start from).
	commits []commitMark
	lastGap int64 // seq of the newest gap commit, -1 when none
	end     *binlog.Position
	// The transaction being read: kept apart until its commit, so a
	// replay after a reconnect can drop it and a huge one costs at most
	// max rows.
	open        []*canonical.Change
	openDropped bool
	lastRow     int
	// gapRows are rows of oversized transactions not carried, counted
	// into DroppedPending when a takeover needed them.
	gapRows int64
	// window is the buffer's age bound; dropped carries DroppedPending
	// over a reset.
	window  time.Duration
	dropped int64
}

func newHandoff(window time.Duration, maxEntries int) *handoff {
	return &handoff{
		max:     maxEntries,
		buf:     newHandoffBuffer[bufEvent](window, maxEntries),
		lastGap: -1,
		lastRow: -1,
		window:  window,
	}
}

// reset empties the buffer (its stream stopped; a new one starts from a
// new checkpoint and would leave a hole), keeping the dropped count.
func (h *handoff) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropped += h.buf.DroppedPending() + h.gapRows
	h.buf = newHandoffBuffer[bufEvent](h.window, h.max)
	h.appended, h.started, h.start, h.commits, h.lastGap, h.end = 0, false, binlog.Position{}, nil, -1, nil
	h.open, h.openDropped, h.lastRow, h.gapRows = nil, false, -1, 0
}

// begin records where the standby's stream starts.
func (h *handoff) begin(pos binlog.Position) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.started, h.start = true, pos
	p := pos
	h.end = &p
}

// handle is the standby stream's handler.
func (h *handoff) handle(_ context.Context, ev binlog.Event) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch := ev.Change; ch != nil {
		if ch.Source.Row <= h.lastRow {
			// A transaction replayed from its first row after a reconnect.
			clear(h.open)
			h.open, h.openDropped = h.open[:0], false
		}
		h.lastRow = ch.Source.Row
		if h.openDropped {
			return nil
		}
		if len(h.open)+1 >= h.max {
			clear(h.open)
			h.open, h.openDropped = nil, true
			return nil
		}
		h.open = append(h.open, ch)
		return nil
	}
	c := *ev.Commit
	now := time.Now()
	if h.openDropped {
		h.appendEntry(bufEvent{commit: &c, gap: true}, now)
		h.lastGap = h.appended - 1
	} else {
		for _, ch := range h.open {
			h.appendEntry(bufEvent{change: ch}, now)
		}
		h.appendEntry(bufEvent{commit: &c}, now)
	}
	clear(h.open)
	h.open, h.openDropped, h.lastRow = h.open[:0], false, -1
	h.end = &c.Pos
	h.buf.Prune(now)
	h.trim()
	return nil
}

func (h *handoff) appendEntry(ev bufEvent, now time.Time) {
	ev.seq = h.appended
	h.appended++
	h.buf.Append(handoffEntry[bufEvent]{Change: ev, ObservedAt: now})
	if ev.commit != nil {
		h.commits = append(h.commits, commitMark{seq: ev.seq, pos: ev.commit.Pos})
	}
}

// headSeq is the seq of the oldest entry still held.
func (h *handoff) headSeq() int64 { return h.appended - int64(h.buf.Len()) }

// trim forgets commit marks no takeover can start from.
func (h *handoff) trim() {
	head := h.headSeq()
	i := 0
	for i < len(h.commits) && h.commits[i].seq < head-1 {
		i++
	}
	if i > 0 {
		h.commits = append(h.commits[:0], h.commits[i:]...)
	}
}

// base is the earliest position the buffer holds every transaction after.
func (h *handoff) base() (binlog.Position, bool) {
	if !h.started {
		return binlog.Position{}, false
	}
	h.trim()
	minSeq := max(h.headSeq()-1, h.lastGap)
	if minSeq < 0 {
		return h.start, true
	}
	for _, m := range h.commits {
		if m.seq >= minSeq {
			return m.pos, true
		}
	}
	return binlog.Position{}, false
}

// markCheckpoint marks the entries of transactions at or before cp as
// enqueued: the leader wrote them.
func (h *handoff) markCheckpoint(cp binlog.Position) {
	h.mu.Lock()
	defer h.mu.Unlock()
	pend := h.buf.Pending(h.buf.Len())
	upTo := -1
	for i, e := range pend {
		if c := e.Change.commit; c != nil {
			if !cp.Covers(c.Pos) {
				break
			}
			upTo = i
		}
	}
	for _, e := range pend[:upTo+1] {
		e.Enqueued = true
	}
}

// droppedPending is what the buffer could not carry.
func (h *handoff) droppedPending() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dropped + h.buf.DroppedPending() + h.gapRows
}

// after returns the buffered transactions after checkpoint cp, and the
// position the new leader's stream continues from, when the buffer holds
// every transaction after cp; ok is false otherwise (re-read from cp). It
// is conservative: positions it cannot compare give false. The standby's
// stream must have stopped.
func (h *handoff) after(cp binlog.Position) (evs []binlog.Event, resume binlog.Position, n int, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	base, known := h.base()
	if !known || h.end == nil || !cp.Covers(base) || !h.end.Covers(cp) {
		h.countGaps(cp)
		return nil, binlog.Position{}, 0, false
	}
	var group []binlog.Event
	for _, e := range h.buf.Pending(h.buf.Len()) {
		ev := e.Change
		if ev.change != nil {
			group = append(group, binlog.Event{Change: ev.change})
			continue
		}
		if cp.Covers(ev.commit.Pos) {
			group = group[:0]
			continue
		}
		if ev.gap {
			return nil, binlog.Position{}, 0, false // cannot happen when base ≥ the gap; be safe
		}
		evs = append(evs, group...)
		evs = append(evs, binlog.Event{Commit: ev.commit})
		n++
		group = nil
	}
	return evs, *h.end, n, true
}

// countGaps adds the rows of oversized transactions after cp, which a
// re-read must now supply, to DroppedPending.
func (h *handoff) countGaps(cp binlog.Position) {
	for _, e := range h.buf.Pending(h.buf.Len()) {
		if c := e.Change.commit; c != nil && e.Change.gap && !cp.Covers(c.Pos) {
			h.gapRows += int64(c.Rows)
			e.Enqueued = true
		}
	}
}

// followerServerID is the replication id of a standby's stream: distinct
// from the leader stream's id of the same replica, so a takeover never
// waits for the server to notice the standby connection closed.
func followerServerID(id uint32) uint32 { return id ^ 1<<31 }

// follow runs a standby's stream until ctx ends: from the stored
// checkpoint (waiting for one to exist), filling h. Errors are logged and
// the stream reopened; a standby's stream is an optimisation, never
// required for correctness.
func (e *Engine) follow(ctx context.Context, h *handoff, load func(context.Context) (*binlog.Position, error)) {
	log := e.log.Named("standby")
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for ctx.Err() == nil {
		pos, err := load(ctx)
		if err != nil || pos == nil {
			if err != nil && ctx.Err() == nil {
				log.Debug("read checkpoint", zap.Error(err))
			}
			if !wait(time.Second) {
				return
			}
			continue
		}
		bcfg := e.streamConfig(pos)
		bcfg.ServerID = followerServerID(bcfg.ServerID)
		s, err := binlog.Open(ctx, bcfg)
		if err != nil {
			if ctx.Err() == nil {
				log.Info("standby stream not open; retrying", zap.Error(err))
			}
			if !wait(2 * time.Second) {
				return
			}
			continue
		}
		h.begin(*pos)
		log.Info("standby streaming into the handoff buffer", zap.String("from", pos.String()))
		mctx, stopMark := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = pause.Every(mctx, time.Second, func() error {
				if cp, err := load(mctx); err == nil && cp != nil {
					h.markCheckpoint(*cp)
				}
				return nil
			})
		}()
		err = s.Run(ctx, h.handle)
		stopMark()
		wg.Wait()
		s.Close()
		if ctx.Err() != nil {
			return
		}
		// The buffer's base is the old stream's start; a new stream from a
		// new checkpoint would leave a hole, so the buffer starts over.
		log.Warn("standby stream stopped; restarting it", zap.Error(err))
		h.reset()
		// Pause before reopening: a server that keeps refusing (a purged
		// or unreadable position) must not be asked 40 times a second.
		pause := time.Second
		if errors.Is(err, binlog.ErrPositionUnavailable) {
			pause = 5 * time.Second
		}
		if !wait(pause) {
			return
		}
	}
}
