package backfill

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
)

// The applier's half of read-only backfills (readonly.go explains the
// protocol and why it is consistent).

// Fence polling: often while windows are open or being asked for, seldom
// while none is (one indexed query on a small table).
const (
	fencePollBusy = 2 * time.Millisecond
	fencePollIdle = 250 * time.Millisecond
)

// fenceBusyFor keeps the polling quick this long after the last fence
// seen: a runner asks for its next window right after fencing a chunk.
const fenceBusyFor = time.Second

// Busy reports whether read-only windows are open or were lately: the
// enqueuer then ticks every couple of milliseconds, so a chunk's window is
// armed and closed without waiting for its flush interval.
func (a *Applier) Busy() bool { return len(a.ro) > 0 || time.Since(a.lastFence) < fenceBusyFor }

type fenceRef struct {
	id    string
	chunk int64
}

// roWindow is an open window of a read-only chunk: from its arming to the
// stream reaching high. Once its rows are handed out (emitted) it stays
// until its fence row is gone (the runner saw the chunk done), so a poll in
// between does not take it for another stream's window.
type roWindow struct {
	window
	high    *position
	emitted bool
}

func fromStream(p binlog.Position) position {
	return position{Flavor: p.Flavor, GTIDSet: p.GTIDSet, File: p.File, Pos: p.Pos}
}

// Tick is told, while the enqueuer is between events, the stream's read
// position and whether it is between transactions (nothing of an open
// transaction was seen). It arms asked-for windows (only between
// transactions, so a window holds whole transactions), takes note of
// fenced ones, and returns the rows of chunks whose fence the stream has
// reached, to enqueue now.
func (a *Applier) Tick(ctx context.Context, pos binlog.Position, between bool) ([]Row, error) {
	now := time.Now()
	every := fencePollIdle
	if a.Busy() {
		every = fencePollBusy
	}
	if now.Sub(a.polled) >= every {
		a.polled = now
		if err := a.pollFences(ctx, fromStream(pos), between); err != nil {
			return nil, err
		}
	}
	return a.Committed(ctx, pos)
}

// Committed returns the rows of the read-only chunks whose fence the
// stream reached with a transaction ending at pos.
func (a *Applier) Committed(ctx context.Context, pos binlog.Position) ([]Row, error) {
	if len(a.ro) == 0 {
		return nil, nil
	}
	p := fromStream(pos)
	var out []Row
	for ref, w := range a.ro {
		if w.emitted || w.high == nil || !reached(p, *w.high) {
			continue
		}
		w.emitted = true
		rows, err := a.emit(ctx, ref.id, &w.window)
		w.changed = nil
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

func (a *Applier) pollFences(ctx context.Context, pos position, between bool) error {
	rows, err := a.db.QueryContext(ctx, "SELECT backfill_id, chunk, tbl, status, COALESCE(high, '') FROM "+a.fences+
		" WHERE instance = ? AND status IN (?, ?, ?)", a.instance, fenceArming, fenceArmed, fenceFenced)
	if err != nil {
		return fmt.Errorf("read backfill fences: %w", err)
	}
	type fenceRow struct {
		ref               fenceRef
		tbl, status, high string
	}
	var list []fenceRow
	for rows.Next() {
		var f fenceRow
		if err := rows.Scan(&f.ref.id, &f.ref.chunk, &f.tbl, &f.status, &f.high); err != nil {
			rows.Close()
			return fmt.Errorf("read backfill fences: %w", err)
		}
		list = append(list, f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read backfill fences: %w", err)
	}
	seen := map[fenceRef]bool{}
	if len(list) > 0 {
		a.lastFence = time.Now()
	}
	for _, f := range list {
		seen[f.ref] = true
		w := a.ro[f.ref]
		switch {
		case f.status == fenceArming:
			if between {
				if err := a.armFence(ctx, f.ref, f.tbl, pos); err != nil {
					return err
				}
			}
		case w == nil:
			// Armed by another stream (a leader before this one): the
			// changes since it armed are unknown here.
			a.log.Info("read-only backfill window opened by another stream; chunk will be read again",
				zap.String("backfill", f.ref.id), zap.Int64("chunk", f.ref.chunk))
			if err := a.giveUpFence(ctx, f.ref); err != nil {
				return err
			}
		case f.status == fenceFenced && w.high == nil:
			var h position
			if err := json.Unmarshal([]byte(f.high), &h); err != nil {
				return fmt.Errorf("backfill %s chunk %d: fence %q: %w", f.ref.id, f.ref.chunk, f.high, err)
			}
			w.high = &h
		}
	}
	for ref := range a.ro {
		if !seen[ref] {
			delete(a.ro, ref) // cancelled, or read again
		}
	}
	return nil
}

// armFence opens the window of an asked-for chunk and tells the runner
// where the stream stands.
func (a *Applier) armFence(ctx context.Context, ref fenceRef, tbl string, pos position) error {
	raw, _ := json.Marshal(pos)
	res, err := a.db.ExecContext(ctx, "UPDATE "+a.fences+" SET status = ?, armed_at = ?, updated_at = NOW(6) WHERE backfill_id = ? AND chunk = ? AND status = ?",
		fenceArmed, string(raw), ref.id, ref.chunk, fenceArming)
	if err != nil {
		return fmt.Errorf("arm backfill %s chunk %d: %w", ref.id, ref.chunk, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil
	}
	db, name := splitTable(tbl)
	a.ro[ref] = &roWindow{window: window{chunk: ref.chunk, ordered: true, db: db, table: name, changed: map[string]struct{}{}}}
	return nil
}

func (a *Applier) giveUpFence(ctx context.Context, ref fenceRef) error {
	delete(a.ro, ref)
	if _, err := a.db.ExecContext(ctx, "UPDATE "+a.fences+" SET status = ?, updated_at = NOW(6) WHERE backfill_id = ? AND chunk = ? AND status IN (?, ?)",
		fenceRetry, ref.id, ref.chunk, fenceArmed, fenceFenced); err != nil {
		return fmt.Errorf("give up backfill %s chunk %d: %w", ref.id, ref.chunk, err)
	}
	return a.markRetry(ctx, ref.id, ref.chunk)
}

// noteReadOnly records ch in the open read-only windows of its table.
func (a *Applier) noteReadOnly(ctx context.Context, ch *canonical.Change) error {
	for ref, w := range a.ro {
		if w.emitted || w.db != ch.Source.DB || w.table != ch.Source.Table {
			continue
		}
		if len(w.changed) >= a.maxChanged {
			a.log.Warn("too many changes inside a backfill window; chunk will be read again",
				zap.String("backfill", ref.id), zap.Int64("chunk", ref.chunk))
			if err := a.giveUpFence(ctx, ref); err != nil {
				return err
			}
			continue
		}
		w.changed[canonical.KeyJSONOf(ch)] = struct{}{}
	}
	return nil
}

func splitTable(tbl string) (db, name string) {
	db, name, _ = strings.Cut(tbl, ".")
	return db, name
}
