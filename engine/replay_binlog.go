package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
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
	if rng.From.Seq <= 1 {
		return "start", nil
	}
	before := strconv.FormatUint(rng.From.Seq-1, 10)
	if probe.Info().Flavor == "mariadb" {
		// domain-server-seq: the domain's sequence numbers are the order.
		parts := splitGTID(rng.From.Text)
		return parts[0] + "-" + parts[1] + "-" + before, nil
	}
	return rng.From.Source + ":1-" + before, nil
}

// splitGTID splits a MariaDB GTID "d-s-n" into its three parts.
func splitGTID(g string) [3]string {
	var out [3]string
	i := 0
	for j := 0; j < len(g) && i < 3; j++ {
		if g[j] == '-' {
			i++
			continue
		}
		out[i] += string(g[j])
	}
	return out
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
	cfg := rp.stream()
	cfg.ServerID, cfg.From, cfg.Resume = rereadServerID(cfg.ServerID), "now", nil
	cfg.Include, cfg.OwnMarkedDBs, cfg.OnTableDDL = []string{table}, nil, nil
	cfg.Logger = log
	probe, err := binlog.Open(ctx, cfg)
	if err != nil {
		return retry("open the binlog to re-read", err)
	}
	oldest, _ := probe.OldestBinlog(ctx)
	endFile, endPos, err := probe.End(ctx)
	if err == nil {
		cfg.From, err = rereadFrom(ctx, probe, rng)
	}
	probe.Close()
	purged := func(err error) bool {
		return fail(fmt.Sprintf("the changes of %s from %s on are older than the outbox holds (retention deleted them) and the server "+
			"no longer has the binlog they were in: its oldest binary log is %s; replay from a later point (%v)", p.Pipe, rng.From.Text, oldest, err))
	}
	if errors.Is(err, binlog.ErrPositionUnavailable) {
		return purged(err)
	}
	if err != nil {
		return retry("find where to re-read the binlog from", err)
	}
	s, err := binlog.Open(ctx, cfg)
	if errors.Is(err, binlog.ErrPositionUnavailable) {
		return purged(err)
	}
	if err != nil {
		return retry("open the binlog to re-read", err)
	}
	defer s.Close()
	log.Info("re-reading the binlog for the part of the replay older than the outbox holds",
		zap.String("from", cfg.From), zap.String("held_from", fmt.Sprintf("%s:%d", held.File, held.Pos)), zap.String("end", fmt.Sprintf("%s:%d", endFile, endPos)))
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
	err = s.Run(sctx, func(_ context.Context, ev binlog.Event) error {
		if c := ev.Commit; c != nil {
			if atOrAfter(c.Pos.File, c.Pos.Pos, replay.Where{File: endFile, Pos: uint64(endPos)}) {
				_ = flush()
				return errRereadDone
			}
			if len(buf) >= rereadBatch {
				return flush()
			}
			return nil
		}
		ch := ev.Change
		w := replay.Where{GTID: ch.Source.GTID, File: ch.Source.File, Pos: uint64(ch.Source.Pos), CommitTime: time.UnixMilli(ch.Source.TsMs).UTC()}
		if (heldOK && atOrAfter(ch.Source.File, ch.Source.Pos, held)) || rng.After(w) {
			_ = flush()
			return errRereadDone
		}
		if r == nil || !r.matches(ch) || !rng.Contains(w) {
			return nil
		}
		rec, ok, dead := rereadRecord(log, r, p.Pipe, ch)
		if ok {
			buf = append(buf, rec)
		}
		if dead {
			_ = replay.Progress(ctx, rp.db, rp.schema, st.ID, p.Pipe, "", 0, 1, "a re-read change the sink's filter cannot evaluate was not replayed", rp.holder)
		}
		return nil
	})
	if stopped || (err != nil && !errors.Is(err, errRereadDone)) {
		if err != nil && !errors.Is(err, errRereadDone) && ctx.Err() == nil {
			return retry("re-read the binlog", err)
		}
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

// rereadRecord is ch as the record route r's sink gets for pipe: masked
// and filtered as the enqueuer does, under its derived id; ok is false
// for a change the sink's filter keeps from it (or cannot evaluate on:
// live delivery dead-letters it; here it is logged and counted failed,
// dead true).
func rereadRecord(log *zap.Logger, r *route, pipe string, ch *canonical.Change) (rec outbox.Record, ok, dead bool) {
	if filtered, reason := r.filterOut(ch); filtered || reason != "" {
		if reason != "" {
			log.Warn("re-read change the sink's filter cannot evaluate: not replayed", zap.String("reason", reason),
				zap.String("pos", fmt.Sprintf("%s:%d", ch.Source.File, ch.Source.Pos)), zap.Int("row", ch.Source.Row))
		}
		return rec, false, reason != ""
	}
	c := *r.mask(ch)
	place := fmt.Sprintf("%s:%d:%d", ch.Source.File, ch.Source.Pos, ch.Source.Row)
	if c.ChangeKey == "" {
		c.ChangeKey = "binlog:" + place
	}
	id := outbox.DerivedID(ch.Source.TsMs, r.sink+"\x00"+pipe+"\x00"+c.ChangeKey+"\x00"+place)
	payload, err := canonical.MarshalEnvelope(&c, id)
	if err != nil {
		log.Warn("re-read change that does not encode: not replayed", zap.String("pos", place), zap.Error(err))
		return rec, false, true
	}
	key := canonical.KeyJSONOf(&c)
	if key == "" {
		key = "null"
	}
	return outbox.Record{ID: id, Pipe: pipe, Sink: r.sink, DB: c.Source.DB, Table: c.Source.Table, Op: c.Op, Key: key,
		Payload: payload, Attempt: 1, CommitTime: time.UnixMilli(ch.Source.TsMs).UTC()}, true, false
}
