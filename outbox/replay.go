package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/state"
)

// Reading delivered records again, for a replay (package replay): a
// pipe's done segments hold every record they were written with, the
// ones that left as outbox rows included, so a replay reads segments in
// id order and asks the rows only whether a record that left was
// delivered after all. Pending records are not replayed (the drainer
// delivers them anyway), nor dead ones (`cdcout dead retry` is for
// those).

// NewestRecordID is the largest record id of pipes ("" when they have
// none): a replay re-delivers nothing newer than what the outbox held
// when it was asked for.
func (s *Store) NewestRecordID(ctx context.Context, pipes []string) (string, error) {
	newest := ""
	for _, pipe := range pipes {
		var id sql.NullString
		if err := s.db.QueryRowContext(ctx, `SELECT GREATEST(COALESCE((SELECT MAX(id) FROM `+s.outbox+` WHERE pipe = ?), ''),
  COALESCE((SELECT last_id FROM `+s.segments+` WHERE pipe = ? AND status = 'done' ORDER BY id DESC LIMIT 1), ''),
  COALESCE((SELECT last_id FROM `+s.segments+` WHERE pipe = ? AND status = 'pending' ORDER BY id DESC LIMIT 1), ''))`,
			pipe, pipe, pipe).Scan(&id); err != nil {
			return "", fmt.Errorf("read the newest record of %s: %w", pipe, err)
		}
		newest = max(newest, id.String)
	}
	return newest, nil
}

// RetentionMarks are, for the pipes named prefix…, the newest record id
// retention deleted of each (Janitor.markDeleted); a pipe retention never
// deleted from has none.
func (s *Store) RetentionMarks(ctx context.Context, prefix string) (map[string]string, error) {
	type mark struct{ pipe, id string }
	marks, err := state.Collect(ctx, s.db, `SELECT pipe, deleted_to FROM `+state.Table(s.schema, "retention_marks")+` WHERE pipe LIKE ?`,
		[]any{state.LikePrefix(prefix)}, func(rows *sql.Rows) (m mark, err error) {
			err = rows.Scan(&m.pipe, &m.id)
			return m, err
		})
	if err != nil {
		return nil, fmt.Errorf("read retention marks: %w", err)
	}
	out := make(map[string]string, len(marks))
	for _, m := range marks {
		out[m.pipe] = m.id
	}
	return out, nil
}

// OldestRecord is the oldest record the outbox still holds for pipe, in
// a segment or as a row; ok is false when it holds none.
func (s *Store) OldestRecord(ctx context.Context, pipe string) (rec Record, ok bool, err error) {
	var seg []byte
	err = s.db.QueryRowContext(ctx, `SELECT payload FROM `+s.segments+` WHERE pipe = ? ORDER BY id LIMIT 1`, pipe).Scan(&seg)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return rec, false, fmt.Errorf("read the oldest segment of %s: %w", pipe, err)
	default:
		recs, err := parseSegment(seg)
		if err != nil {
			return rec, false, fmt.Errorf("oldest segment of %s: %w", pipe, err)
		}
		if len(recs) > 0 {
			rec, ok = recs[0].record(pipe, "", 1), true
		}
	}
	var row Record
	var commit state.Time
	var op string
	err = s.db.QueryRowContext(ctx, `SELECT id, db, tbl, op, row_key, commit_ts, payload FROM `+s.outbox+` WHERE pipe = ? ORDER BY id LIMIT 1`, pipe).
		Scan(&row.ID, &row.DB, &row.Table, &op, &row.Key, &commit, &row.Payload)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return rec, ok, nil
	case err != nil:
		return rec, false, fmt.Errorf("read the oldest row of %s: %w", pipe, err)
	}
	if !ok || row.ID < rec.ID {
		row.Pipe, row.Op, row.CommitTime, row.Attempt = pipe, canonical.Op(op), commit.T, 1
		return row, true, nil
	}
	return rec, true, nil
}

// ReplayPage is one page of a pipe's delivered records for a replay.
type ReplayPage struct {
	// Records are the delivered records after the page's start, in id
	// (commit) order, none newer than the replay's newest id.
	Records []Record
	// Next is where the next page starts (the last record id looked at,
	// delivered or not); "" with Done.
	Next string
	// Done: nothing is left up to the newest id.
	Done bool
}

// DeliveredAfter reads the next page of pipe's delivered records with ids
// in (after, newest]: the done segments from the one holding after on, at
// most segments of them.
func (s *Store) DeliveredAfter(ctx context.Context, pipe, sink, after, newest string, segments int) (ReplayPage, error) {
	var page ReplayPage
	type seg struct {
		id, last string
		payload  []byte
	}
	var segs []seg
	read := func(q string, args ...any) error {
		rows, err := s.db.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var sg seg
			if err := rows.Scan(&sg.id, &sg.last, &sg.payload); err != nil {
				return err
			}
			segs = append(segs, sg)
		}
		return rows.Err()
	}
	if after != "" {
		// The segment holding after, when a page ended inside it: the
		// last one starting at or before it (a condition on last_id in
		// the query would walk every older segment when there is none).
		if err := read(`SELECT id, last_id, payload FROM `+s.segments+` WHERE pipe = ? AND status = 'done' AND id <= ?
ORDER BY id DESC LIMIT 1`, pipe, after); err != nil {
			return page, fmt.Errorf("read segments of %s: %w", pipe, err)
		}
		if len(segs) == 1 && segs[0].last <= after {
			segs = segs[:0]
		}
	}
	held := len(segs)
	if err := read(`SELECT id, last_id, payload FROM `+s.segments+` WHERE pipe = ? AND status = 'done' AND id > ? AND id <= ?
ORDER BY id LIMIT ?`, pipe, after, newest, segments); err != nil {
		return page, fmt.Errorf("read segments of %s: %w", pipe, err)
	}
	// Every segment after the one holding after has its first record in
	// (after, newest], so a page with one moves Next on; without one
	// there is nothing more.
	page.Done = len(segs) == held
	page.Next = after
	for _, sg := range segs {
		recs, err := parseSegment(sg.payload)
		if err != nil {
			return page, fmt.Errorf("segment %s: %w", sg.id, err)
		}
		left, err := s.leftRows(ctx, pipe, sg.id, sg.last)
		if err != nil {
			return page, err
		}
		for i := range recs {
			r := &recs[i]
			if r.id <= after || r.id > newest {
				continue
			}
			page.Next = r.id
			if st, ok := left[r.id]; ok && st != StatusDelivered {
				continue
			}
			page.Records = append(page.Records, r.record(pipe, sink, 1))
		}
	}
	return page, nil
}

// leftRows are the statuses of the rows of records that left the
// segment [first, last] of pipe.
func (s *Store) leftRows(ctx context.Context, pipe, first, last string) (map[string]Status, error) {
	type left struct {
		id string
		st Status
	}
	rows, err := state.Collect(ctx, s.db, `SELECT id, status FROM `+s.outbox+` WHERE id BETWEEN ? AND ? AND pipe = ?`, []any{first, last, pipe},
		func(r *sql.Rows) (l left, err error) {
			err = r.Scan(&l.id, &l.st)
			return l, err
		})
	if err != nil {
		return nil, fmt.Errorf("read rows of %s: %w", pipe, err)
	}
	out := make(map[string]Status, len(rows))
	for _, l := range rows {
		out[l.id] = l.st
	}
	return out, nil
}
