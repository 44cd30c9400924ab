package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/cdcout/cdcout/state"
)

// Backlog is one pipe's records by state, outbox rows and records still in
// segments added (see Store.Backlogs).
type Backlog struct {
	// Pending counts undelivered records not being delivered; Delivering
	// those claimed by a drainer whose claim has not lapsed.
	Pending, Delivering, Delivered, Dead int64
	// Undelivered is whether the pipe has an undelivered record; OldestAge
	// and Lag are then how long ago the oldest one was enqueued and
	// committed at the source (0 when the clocks disagree).
	Undelivered    bool
	OldestAge, Lag time.Duration
}

// Backlogs counts the records of the pipes named prefix… per pipe. A
// record is an outbox row or a record still in a segment:
//
//   - a pending segment's records are pending, or delivering while the
//     segment is claimed (claimer set, claim not lapsed);
//   - a done segment's records were delivered, except those that left it
//     as outbox rows, which count in their row's status instead
//     (rowsFromKeptSegments says how they are told apart).
//
// Counting rows touches only the outbox's `due` index (pipe, status, …);
// the other row aggregates read undelivered rows only, which a healthy
// outbox has few of. Segments are one per enqueued transaction and pipe:
// their record counts are read over the fifo index (pipe, status, id,
// records). A dashboard polling every two seconds stays cheap even with
// millions of delivered records kept for retention.
func (s *Store) Backlogs(ctx context.Context, prefix string) (map[string]*Backlog, error) {
	out := map[string]*Backlog{}
	// The pipes first: with "pipe IN (…) AND status = …" the queries below
	// read only the entries of that status in the (pipe, status, …)
	// indexes, where "pipe LIKE ?" would read every entry of the pipes.
	pipes, err := s.PipesWithRecords(ctx, prefix, "")
	if err != nil {
		return nil, fmt.Errorf("list pipes: %w", err)
	}
	if len(pipes) == 0 {
		return out, nil
	}
	in := "pipe IN (" + state.Placeholders(len(pipes)) + ")"
	args := make([]any, len(pipes))
	for i, p := range pipes {
		args[i] = p
	}
	q := backlogQuery{s: s, out: out}
	var (
		status   string
		n, m     int64
		age, lag sql.NullInt64
		twice    = append(append([]any{}, args...), args...)
	)
	// Rows by status, and how many of them left a segment still kept.
	left, join := rowsFromKeptSegments(s.segments, in)
	q.run(ctx, "count outbox rows", `SELECT o.pipe, o.status, COUNT(*), `+left+`
FROM `+s.outbox+` o `+join+`
WHERE o.`+in+` GROUP BY o.pipe, o.status`, twice, []any{&status, &n, &m}, func(b *Backlog) {
		switch Status(status) {
		case StatusPending:
			b.Pending += n
		case StatusDelivered:
			b.Delivered += n
		case StatusDead:
			b.Dead += n
		}
		b.Delivered -= m
	})
	// A claimed ("delivering") row is a pending row with a claimer whose
	// next attempt is the claim's expiry: a short range of the due index.
	q.run(ctx, "count claimed outbox rows", `SELECT pipe, COUNT(*) FROM `+s.outbox+`
WHERE `+in+` AND status = 'pending' AND next_attempt_at > NOW(6) AND claimer <> 0 GROUP BY pipe`, args, []any{&n}, func(b *Backlog) {
		b.Pending -= n
		b.Delivering += n
	})
	q.run(ctx, "read oldest pending row", `SELECT pipe,
  TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)),
  TIMESTAMPDIFF(MICROSECOND, MIN(commit_ts), NOW(6))
FROM `+s.outbox+` WHERE `+in+` AND status = 'pending' GROUP BY pipe`, args, []any{&age, &lag}, func(b *Backlog) {
		b.older(age, lag)
	})
	// Pending segments are few: a healthy pipe has one or none.
	q.run(ctx, "count pending segment records", `SELECT pipe, SUM(records),
  SUM(IF(claimer <> 0 AND next_attempt_at > NOW(6), records, 0)),
  TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)),
  TIMESTAMPDIFF(MICROSECOND, MIN(first_commit_ts), NOW(6))
FROM `+s.segments+` WHERE `+in+` AND status = 'pending' GROUP BY pipe`, args, []any{&n, &m, &age, &lag}, func(b *Backlog) {
		b.Pending += n - m
		b.Delivering += m
		b.older(age, lag)
	})
	// Done segments are all those of the retention; records is in the fifo
	// index (pipe, status, id, records), so the sum reads only the index.
	q.run(ctx, "count delivered segment records", `SELECT pipe, SUM(records) FROM `+s.segments+`
WHERE `+in+` AND status = 'done' GROUP BY pipe`, args, []any{&n}, func(b *Backlog) {
		b.Delivered += n
	})
	if q.err != nil {
		return nil, q.err
	}
	for _, b := range out {
		b.Delivered = max(b.Delivered, 0)
	}
	return out, nil
}

// older makes the backlog's oldest record the older of it and one of age
// and lag microseconds (NULL: none).
func (b *Backlog) older(age, lag sql.NullInt64) {
	if !age.Valid {
		return
	}
	us := func(v int64) time.Duration { return time.Duration(max(v, 0)) * time.Microsecond }
	if !b.Undelivered || us(age.Int64) > b.OldestAge {
		b.OldestAge = us(age.Int64)
	}
	if lag.Valid && (!b.Undelivered || us(lag.Int64) > b.Lag) {
		b.Lag = us(lag.Int64)
	}
	b.Undelivered = true
}

// backlogQuery runs the aggregate queries of Backlogs, each row's backlog
// (by its first column, the pipe) handed to a callback, until one fails.
type backlogQuery struct {
	s   *Store
	out map[string]*Backlog
	err error
}

func (q *backlogQuery) run(ctx context.Context, what, query string, args, dest []any, row func(b *Backlog)) {
	if q.err != nil {
		return
	}
	if err := q.scan(ctx, query, args, dest, row); err != nil {
		q.err = fmt.Errorf("%s: %w", what, err)
	}
}

func (q *backlogQuery) scan(ctx context.Context, query string, args, dest []any, row func(b *Backlog)) error {
	rows, err := q.s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var pipe string
	for rows.Next() {
		if err := rows.Scan(append([]any{&pipe}, dest...)...); err != nil {
			return err
		}
		b := q.out[pipe]
		if b == nil {
			b = &Backlog{}
			q.out[pipe] = b
		}
		row(b)
	}
	return rows.Err()
}

// PipeError is a pipe's most recent delivery error.
type PipeError struct {
	Error string
	At    time.Time
}

// LastErrors returns the last error of each pipe named prefix… that has
// one. A segment held whole (the sink failed every record tried) holds the
// pipe up, so its error comes first; otherwise the newest of the rows not
// delivered (a record that failed left its segment as a row).
func (s *Store) LastErrors(ctx context.Context, prefix string) (map[string]PipeError, error) {
	like := state.LikePrefix(prefix)
	out := map[string]PipeError{}
	for _, e := range []struct{ what, q string }{
		{"read held segments", `SELECT pipe, last_error, last_error_at FROM ` + s.segments + `
WHERE pipe LIKE ? AND status = 'pending' AND last_error_at IS NOT NULL ORDER BY last_error_at DESC`},
		{"read pipe errors", `SELECT o.pipe, o.last_error, o.last_error_at
FROM ` + s.outbox + ` o JOIN (
  SELECT pipe, MAX(last_error_at) AS m FROM ` + s.outbox + `
  WHERE pipe LIKE ? AND status <> 'delivered' AND last_error_at IS NOT NULL GROUP BY pipe
) x ON o.pipe = x.pipe AND o.last_error_at = x.m
WHERE o.status <> 'delivered'`},
	} {
		if err := s.scanErrors(ctx, e.q, like, out); err != nil {
			return nil, fmt.Errorf("%s: %w", e.what, err)
		}
	}
	return out, nil
}

// scanErrors adds the (pipe, error, at) rows of q to out, the first one of
// a pipe with a time winning.
func (s *Store) scanErrors(ctx context.Context, q, like string, out map[string]PipeError) error {
	rows, err := s.db.QueryContext(ctx, q, like)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			pipe string
			msg  sql.NullString
			at   sqlTime
		)
		if err := rows.Scan(&pipe, &msg, &at); err != nil {
			return err
		}
		if cur, ok := out[pipe]; !ok || cur.At.IsZero() {
			out[pipe] = PipeError{Error: msg.String, At: at.T}
		}
	}
	return rows.Err()
}
