package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/pause"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/replay"
)

// The part of a replay older than what the outbox holds of a pipe —
// retention deleted those records (retention_marks) — is re-read from the
// binlog: a stream of its own (rereadServerID) from the range's start
// (a GTID: the set just before it; file:pos: there; a time: the newest
// binlog file opened before it, binlog.Stream.FileAt) to the oldest
// record the pipe still holds, the range's end, or the log's end when the
// pipe holds none. Only the pipe's table is decoded, and the sink's route
// (tables, ops, filter:, column transforms) is applied as the enqueuer
// applies it; the sink formats the records as any. Such a change is
// delivered under outbox.DerivedID of the sink and the change's place,
// not under its deleted record's id, the same on every re-read. The
// re-read is not saved part way: a takeover (or restart) re-reads it
// whole, under the same ids. Once it is through, the pipe's progress
// moves to the retention mark, and the outbox part goes on as for any
// replay. A binlog the server purged fails the pipe's replay with the
// oldest binlog it still has.

// rereadBatch is how many re-read records wait for one ordered delivery.
const rereadBatch = 256

// rereadIdle is how long a re-read bounded only by the log's end waits
// without an event before it counts the log as read: the server sends
// events as fast as the reader takes them until it is caught up.
const rereadIdle = 3 * time.Second

// rereadServerID is the replication id of a replica's re-read stream:
// distinct from its stream's and its standby stream's
// (followerServerID).
func rereadServerID(id uint32) uint32 { return id ^ 3<<30 }

// needsReread reports whether pipe's part of a replay starts before
// what the outbox holds of it, and if so where the held records begin
// (ok false: none held) and the retention mark.
func (rp *replayer) needsReread(ctx context.Context, rng replay.Range, p replay.PipeProgress) (need bool, held replay.Where, ok bool, mark string, err error) {
	if p.LastID != "" || rp.stream == nil {
		return false, held, false, "", nil
	}
	marks, err := rp.store.RetentionMarks(ctx, p.Pipe)
	if err != nil {
		return false, held, false, "", err
	}
	if mark = marks[p.Pipe]; mark == "" {
		return false, held, false, "", nil // nothing was deleted
	}
	rec, ok, err := rp.store.OldestRecord(ctx, p.Pipe)
	if err != nil || !ok {
		return err == nil, held, false, mark, err
	}
	if held, err = replay.WhereOf(rec.Payload, rec.CommitTime); err != nil {
		return false, held, false, "", err
	}
	// Commit times may be whole seconds (MariaDB): records of the held
	// one's second may be gone, so a time range from that second on
	// re-reads up to the held record's place too.
	sameTime := rng.From.Kind == replay.KindTime && !rng.From.Time.After(held.CommitTime)
	return sameTime || rng.StartsBefore(held), held, true, mark, nil
}

// rereadFrom is where the re-read stream starts for rng.
func rereadFrom(ctx context.Context, probe *binlog.Stream, rng replay.Range) (string, error) {
	switch rng.From.Kind {
	case replay.KindFilePos:
		return rng.From.Text, nil
	case replay.KindTime:
		return probe.FileAt(ctx, rng.From.Time)
	}
	return gtidStartBefore(rng.From, probe.Info().Flavor == "mariadb"), nil
}

// gtidStartBefore is the stream start (binlog.Config.From) just before
// the GTID p: the set of its source up to the one before it ("start" for
// a source's first).
func gtidStartBefore(p replay.Point, mariadb bool) string {
	if p.Seq <= 1 {
		return "start"
	}
	before := strconv.FormatUint(p.Seq-1, 10)
	if mariadb {
		// domain-server-seq: the domain's sequence numbers are the order.
		parts := strings.SplitN(p.Text, "-", 3)
		return parts[0] + "-" + parts[1] + "-" + before
	}
	return p.Source + ":1-" + before
}

// atOrAfter reports whether a change at file:pos lies at or after w in
// the binlog (file:pos of one server).
func atOrAfter(file string, pos uint32, w replay.Where) bool {
	a, err1 := replay.ParsePoint(file + ":" + strconv.FormatUint(uint64(pos), 10))
	b, err2 := replay.ParsePoint(w.File + ":" + strconv.FormatUint(w.Pos, 10))
	if err1 != nil || err2 != nil || a.Base != b.Base {
		return false
	}
	return a.Num > b.Num || (a.Num == b.Num && a.Pos >= b.Pos)
}

// reached reports whether a change at w is at or after the held record
// at held: by GTID when both have one of the same source (a MariaDB
// domain, a MySQL server uuid), which holds on another server after a
// failover too, else by file:pos.
func reached(w, held replay.Where) bool {
	a, errA := replay.ParsePoint(w.GTID)
	b, errB := replay.ParsePoint(held.GTID)
	if errA == nil && errB == nil && a.Kind == replay.KindGTID && b.Kind == replay.KindGTID && a.Source == b.Source {
		return a.Seq >= b.Seq
	}
	return atOrAfter(w.File, uint32(w.Pos), held)
}

// errRereadDone ends the re-read stream at its bound.
var errRereadDone = errors.New("re-read reached its end")

// reread re-delivers pipe's changes of rng older than held (ok: there is
// a held record) from the binlog. It reports whether it got through; a
// purged binlog fails the pipe's replay.
func (rp *replayer) reread(ctx context.Context, log *zap.Logger, st replay.Status, rng replay.Range, p replay.PipeProgress, se sinkEntry,
	held replay.Where, heldOK bool, mark string, mine func() bool) bool {
	rp.rereadMu.Lock() // one re-read stream per replica: its server id
	defer rp.rereadMu.Unlock()
	_, table, _, _ := outbox.SplitPipe(p.Pipe)
	fail := func(msg string) bool {
		log.Error("replay of the pipe failed", zap.String("reason", msg))
		if err := replay.FailPipe(ctx, rp.db, rp.schema, st.ID, p.Pipe, msg, rp.holder); err != nil {
			log.Warn("record the replay's failure", zap.Error(err))
		}
		return false
	}
	retry := func(what string, err error) bool {
		log.Warn(what, zap.Error(err))
		_ = replay.Progress(ctx, rp.db, rp.schema, st.ID, p.Pipe, "", 0, 0, what+": "+err.Error(), rp.holder)
		return false // the next scan starts the pipe's replay again
	}
	s, from, end, oldest, err := rp.openReread(ctx, log, rng, table)
	if errors.Is(err, binlog.ErrPositionUnavailable) {
		log.Error("the binlog to re-read is purged", zap.Error(err))
		return fail(fmt.Sprintf("the changes of %s from %s on are older than the outbox holds (retention deleted them) and the server "+
			"no longer has the binlog they were in: its oldest binary log is %s; replay from a later point", p.Pipe, rng.From.Text, oldest))
	}
	if err != nil {
		return retry("open the binlog to re-read", err)
	}
	defer s.Close()
	log.Info("re-reading the binlog for the part of the replay older than the outbox holds",
		zap.String("from", from), zap.String("held_from", fmt.Sprintf("%s:%d", held.File, held.Pos)), zap.String("end", fmt.Sprintf("%s:%d", end.File, end.Pos)))
	var r *route
	for _, cand := range rp.routes {
		if cand.sink == st.Sink {
			r = cand
		}
	}
	var (
		buf     []outbox.Record
		stopped bool
		n       int
	)
	flush := func() error {
		if len(buf) > 0 && !rp.deliverInOrder(ctx, log, st, p.Pipe, se, buf, mine, false) {
			stopped = true
			return errRereadDone
		}
		n += len(buf)
		buf = buf[:0]
		return nil
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var idle *idleWatch
	if !heldOK {
		// No held record bounds the re-read: it ends at the log's end,
		// which an idle server may never pass with a commit.
		idle = newIdleWatch(sctx, cancel, rereadIdle)
	}
	err = s.Run(sctx, func(_ context.Context, ev binlog.Event) error {
		defer idle.busy()()
		if c := ev.Commit; c != nil {
			if atOrAfter(c.Pos.File, c.Pos.Pos, end) {
				return errRereadDone
			}
			if len(buf) >= rereadBatch {
				return flush()
			}
			return nil
		}
		ch := ev.Change
		w := replay.Where{GTID: ch.Source.GTID, File: ch.Source.File, Pos: uint64(ch.Source.Pos), CommitTime: time.UnixMilli(ch.Source.TsMs).UTC()}
		if (heldOK && reached(w, held)) || rng.After(w) {
			return errRereadDone
		}
		if r == nil || !r.matches(ch) || !rng.Contains(w) {
			return nil
		}
		rec, ok, dead := rereadRecord(log, r, p.Pipe, ch, rp.maxRowBytes)
		if ok {
			buf = append(buf, rec)
		}
		if dead != "" {
			_ = replay.Progress(ctx, rp.db, rp.schema, st.ID, p.Pipe, "", 0, 1, dead, rp.holder)
		}
		return nil
	})
	caughtUp := idle.fired() && ctx.Err() == nil
	switch {
	case stopped:
		return false
	case errors.Is(err, binlog.ErrPositionUnavailable):
		// Purged while it was read.
		log.Error("the binlog being re-read was purged", zap.Error(err))
		return fail(fmt.Sprintf("the server purged binlogs the re-read of %s still needed while it ran (its oldest binary log is now %s); replay from a later point", p.Pipe, oldestOf(ctx, s)))
	case err != nil && !errors.Is(err, errRereadDone) && !caughtUp:
		if ctx.Err() != nil {
			return false
		}
		return retry("re-read the binlog", err)
	}
	_ = flush()
	if stopped {
		return false
	}
	// Through: the outbox part goes on after what retention deleted.
	if err := replay.Progress(ctx, rp.db, rp.schema, st.ID, p.Pipe, mark, 0, 0, "", rp.holder); err != nil {
		log.Warn("record replay progress", zap.Error(err))
		return false
	}
	log.Info("re-read of the binlog done", zap.Int("records", n))
	return true
}

// openReread opens the re-read stream of table for rng: where it starts,
// the log's end now, and the oldest binlog the server has (also when the
// start is purged: the error wraps binlog.ErrPositionUnavailable).
func (rp *replayer) openReread(ctx context.Context, log *zap.Logger, rng replay.Range, table string) (s *binlog.Stream, from string, end replay.Where, oldest string, err error) {
	cfg := rp.stream()
	cfg.ServerID, cfg.From, cfg.Resume = rereadServerID(cfg.ServerID), "now", nil
	cfg.Include, cfg.OwnMarkedDBs, cfg.OnTableDDL = []string{table}, nil, nil
	cfg.Logger = log
	probe, err := binlog.Open(ctx, cfg)
	if err != nil {
		return nil, "", end, "", err
	}
	defer probe.Close()
	oldest = oldestOf(ctx, probe)
	endFile, endPos, err := probe.End(ctx)
	if err != nil {
		return nil, "", end, oldest, err
	}
	end = replay.Where{File: endFile, Pos: uint64(endPos)}
	if cfg.From, err = rereadFrom(ctx, probe, rng); err != nil {
		return nil, "", end, oldest, err
	}
	s, err = binlog.Open(ctx, cfg)
	return s, cfg.From, end, oldest, err
}

// oldestOf is the oldest binlog s's server has, or why it is not known.
func oldestOf(ctx context.Context, s *binlog.Stream) string {
	oldest, err := s.OldestBinlog(ctx)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return oldest
}

// rereadRecord is ch as the record route r's sink gets for pipe: masked
// and filtered as the enqueuer does, under its derived id; ok is false
// for a change the sink's filter keeps from it (or cannot evaluate on:
// live delivery dead-letters it, as one whose row images exceed
// maxRowBytes; here it is logged and counted failed, dead its reason).
func rereadRecord(log *zap.Logger, r *route, pipe string, ch *canonical.Change, maxRowBytes int) (rec outbox.Record, ok bool, dead string) {
	place := fmt.Sprintf("%s:%d:%d", ch.Source.File, ch.Source.Pos, ch.Source.Row)
	filtered, dead := r.filterOut(ch)
	if n := ch.ImageBytes(); dead == "" && !filtered && maxRowBytes > 0 && n > maxRowBytes {
		dead = fmt.Sprintf("a re-read change's row images of %d bytes exceed max_row_bytes %d", n, maxRowBytes)
	}
	if dead != "" {
		log.Warn("re-read change not replayed", zap.String("reason", dead), zap.String("place", place))
	}
	if filtered || dead != "" {
		return rec, false, dead
	}
	c := *r.mask(ch)
	if c.ChangeKey == "" {
		c.ChangeKey = "binlog:" + place
	}
	id := outbox.DerivedID(ch.Source.TsMs, r.sink+"\x00"+pipe+"\x00"+c.ChangeKey+"\x00"+place)
	payload, err := canonical.MarshalEnvelope(&c, id)
	if err != nil {
		log.Warn("re-read change that does not encode: not replayed", zap.String("place", place), zap.Error(err))
		return rec, false, "a re-read change does not encode: " + err.Error()
	}
	key := canonical.KeyJSONOf(&c)
	if key == "" {
		key = "null"
	}
	return outbox.Record{ID: id, Pipe: pipe, Sink: r.sink, DB: c.Source.DB, Table: c.Source.Table, Op: c.Op, Key: key,
		Payload: payload, Attempt: 1, CommitTime: time.UnixMilli(ch.Source.TsMs).UTC()}, true, ""
}

// idleWatch cancels a re-read that has had no event for a while, outside
// its handler (a slow delivery is not idleness). A nil watch does
// nothing.
type idleWatch struct {
	mu      sync.Mutex
	inside  bool
	last    time.Time
	didFire bool
}

func newIdleWatch(ctx context.Context, cancel context.CancelFunc, after time.Duration) *idleWatch {
	w := &idleWatch{last: time.Now()}
	go func() {
		_ = pause.Every(ctx, after/5, func() error {
			w.mu.Lock()
			idle := !w.inside && time.Since(w.last) >= after
			w.didFire = w.didFire || idle
			w.mu.Unlock()
			if idle {
				cancel() // ends ctx, and with it the loop
			}
			return nil
		})
	}()
	return w
}

// busy marks the handler running; the returned func marks it done.
func (w *idleWatch) busy() func() {
	if w == nil {
		return func() {}
	}
	w.mu.Lock()
	w.inside = true
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.inside, w.last = false, time.Now()
		w.mu.Unlock()
	}
}

// fired reports whether the watch ended the re-read.
func (w *idleWatch) fired() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.didFire
}
