package backfill

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/pause"
)

// Defaults of a Spec.
const (
	DefaultChunkSize = 1000
	MaxChunkSize     = 100_000
	// DefaultInFlight chunks may wait for the stream at once: the runner
	// reads ahead while the enqueuer catches up, and memory (and the
	// chunk blobs in the state table) stays bounded.
	DefaultInFlight = 8
	// DefaultStall: a chunk not applied this long after its high
	// watermark is read again (the applier crashed between enqueueing
	// it and marking it done, or nothing streams).
	DefaultStall = 2 * time.Minute
)

// Spec is what to backfill.
type Spec struct {
	// Table is "db.tbl".
	Table string
	// Sinks are the sink names to feed; the caller resolves the default
	// (every sink subscribed to the table).
	Sinks []string
	// Where, when set, limits the rows (an SQL condition).
	Where     string
	ChunkSize int
	Instance  string
	// ResumeID continues that backfill; "" continues an unfinished
	// backfill with the same table, sinks, where and instance, or starts a
	// new one.
	ResumeID string
	// ReadOnly fences chunks with binlog positions instead of watermark
	// rows: nothing is written to the source (readonly.go).
	ReadOnly bool
	// Owner is OwnerFleet for a backfill the enqueue leader runs (snapshot:
	// initial, signals, POST /v1/backfills): a new leader resumes it, so
	// an interrupted run leaves it running. "" is cdcout backfill's own.
	Owner string
	// Origin says what started it: "cli", "snapshot", "signal:<id>",
	// "http".
	Origin string
}

// OwnerFleet marks the backfills the enqueue lease holder runs.
const OwnerFleet = "fleet"

// Progress is reported after every completed chunk.
type Progress struct {
	ID       string
	Rows     int64 // rows read in completed chunks
	Enqueued int64 // rows enqueued (rows changed inside a window are left to the stream)
	Estimate int64 // information_schema's row estimate
	Elapsed  time.Duration
}

// Runner reads one backfill's chunks between watermarks.
type Runner struct {
	Source      *sql.DB // the source server
	State       *sql.DB // the state database's server
	StateSchema string
	Logger      *zap.Logger
	// OnProgress, when set, is called after each completed chunk.
	OnProgress func(Progress)
	InFlight   int
	Stall      time.Duration
	// PollInterval is the first wait between looks at the chunks' states
	// (default 5ms); it doubles, up to 8 times, while no chunk completes,
	// so a runner waiting on a slow stream costs few queries.
	PollInterval time.Duration
	// Retryable, when set, picks the errors that leave the backfill
	// running (with the error recorded) for the next run to resume — a
	// fleet backfill's database going away — instead of failed.
	Retryable func(error) bool

	spec     Spec
	keyOrder bool // see meta.KeyOrder
	readOnly bool
	flavor   string    // "mysql" or "mariadb", for a read-only backfill
	store    *runStore // state SQL (runstore.go)
	next     int64     // the next chunk number
	table    *tableInfo
	conn     *sql.Conn
	id       string
	wm       string
	started  time.Time
	prog     Progress
}

// ID is the backfill's id (after Prepare).
func (r *Runner) ID() string { return r.id }

// flight is a chunk between its high watermark and done.
type flight struct {
	no         int64
	start, end keyArgs // start exclusive (nil: from the first row), end inclusive
	endJSON    string
	rows       int
	at         time.Time
}

// Run reads every chunk and waits until each is applied by the stream.
// It returns ErrCancelled when the backfill is cancelled meanwhile; any
// other error leaves it resumable (status failed).
func (r *Runner) Run(ctx context.Context) (err error) {
	if r.table == nil {
		return errors.New("backfill: Run before Prepare")
	}
	inFlight := r.InFlight
	if inFlight <= 0 {
		inFlight = DefaultInFlight
	}
	stall := r.Stall
	if stall <= 0 {
		stall = DefaultStall
	}
	poll := r.PollInterval
	if poll <= 0 {
		poll = 5 * time.Millisecond
	}
	defer func() {
		if err == nil || errors.Is(err, ErrCancelled) {
			return
		}
		if r.spec.Owner == OwnerFleet && ctx.Err() != nil {
			return // the leader stepped down: the next one resumes it
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		r.store.ended(fctx, err, r.Retryable != nil && r.Retryable(err))
	}()
	conn, err := r.Source.Conn(ctx)
	if err != nil {
		return fmt.Errorf("connect to the source: %w", err)
	}
	defer conn.Close()
	// TIMESTAMP values as UTC text, the binlog decoder's form.
	if _, err := conn.ExecContext(ctx, "SET time_zone = '+00:00'"); err != nil {
		return fmt.Errorf("set session time zone: %w", err)
	}
	r.conn = conn

	pos, next, redo, err := r.resume(ctx)
	if err != nil {
		return err
	}
	r.next = next

	wait := poll
	var queue []*flight
	eof := false
	for !eof || len(queue) > 0 || len(redo) > 0 {
		if len(redo) > 0 && len(queue) < inFlight {
			f := redo[0]
			redo = redo[1:]
			f.no = r.nextNo()
			if _, err := r.chunk(ctx, f, true); err != nil {
				return err
			}
			pos = f.end
			queue = append(queue, f)
			continue
		}
		if !eof && len(queue) < inFlight {
			f := &flight{no: r.nextNo(), start: pos}
			n, err := r.chunk(ctx, f, false)
			if err != nil {
				return err
			}
			if n == 0 {
				eof = true
				continue
			}
			pos = f.end
			queue = append(queue, f)
			if len(queue) < inFlight {
				continue // read ahead while the stream catches up
			}
		}
		if len(queue) == 0 {
			continue
		}
		advanced, err := r.settle(ctx, &queue, stall)
		if err != nil {
			return err
		}
		if advanced {
			wait = poll
			continue
		}
		if err := pause.For(ctx, wait); err != nil {
			return err
		}
		wait = min(2*wait, 8*poll)
	}
	return r.done(ctx)
}

// settle looks at the in-flight chunks: completed ones at the head advance
// the recorded progress; retried and stalled ones are read again.
func (r *Runner) settle(ctx context.Context, queue *[]*flight, stall time.Duration) (bool, error) {
	q := *queue
	nos := make([]int64, len(q))
	for i, f := range q {
		nos[i] = f.no
	}
	states, err := r.store.chunkStates(ctx, nos)
	if err != nil {
		return false, err
	}
	advanced := false
	for _, f := range q {
		s, ok := states[f.no]
		stalled := ok && s.status == chunkWritten && time.Since(f.at) > stall
		if ok && s.status != chunkRetry && !stalled {
			continue
		}
		if stalled {
			r.Logger.Warn("backfill chunk not applied in time (is the enqueue lease holder streaming?); reading it again",
				zap.String("backfill", r.id), zap.Int64("chunk", f.no), zap.Duration("waited", time.Since(f.at)))
		}
		// Cancelled (chunk rows deleted), retried or stalled: read the
		// same key range again under new watermarks.
		if !ok {
			if err := r.store.cancelled(ctx); err != nil {
				return false, err
			}
		}
		old := f.no
		f.no = r.nextNo()
		if err := r.store.dropChunks(ctx, old); err != nil {
			return false, err
		}
		if _, err := r.chunk(ctx, f, true); err != nil {
			return false, err
		}
		advanced = true
	}
	// The completed chunks at the head are recorded together: one progress
	// update and one delete however many finished since the last look.
	var done []int64
	var last *flight
	for len(q) > 0 {
		s, ok := states[q[0].no]
		if !ok || s.status != chunkDone {
			break
		}
		last = q[0]
		q = q[1:]
		done = append(done, last.no)
		r.prog.Rows += int64(last.rows)
		r.prog.Enqueued += int64(s.emitted)
	}
	if last != nil {
		r.prog.Elapsed = time.Since(r.started)
		m := meta{Instance: r.spec.Instance, Sinks: r.spec.Sinks, ChunkSize: r.spec.ChunkSize, Resume: last.end.encode(), KeyOrder: r.keyOrder,
			ReadOnly: r.readOnly, Owner: r.spec.Owner, Origin: r.spec.Origin}
		recorded, err := r.store.progress(ctx, last.endJSON, m, r.prog.Rows)
		if err != nil {
			return false, err
		}
		if !recorded {
			if err := r.store.cancelled(ctx); err != nil {
				return false, err
			}
		}
		if err := r.store.dropChunks(ctx, done...); err != nil {
			return false, err
		}
		advanced = true
		if r.OnProgress != nil {
			r.OnProgress(r.prog)
		}
	}
	*queue = q
	return advanced, nil
}

// chunk writes LOW, reads the chunk, stores it, writes HIGH (a read-only
// backfill fences it with binlog positions instead, readonly.go). again
// re-reads f's recorded range (start, end]; otherwise it reads up to
// ChunkSize rows after f.start and sets f.end. It returns the rows read.
func (r *Runner) chunk(ctx context.Context, f *flight, again bool) (int, error) {
	if r.readOnly {
		return r.chunkReadOnly(ctx, f, again)
	}
	if err := r.mark(ctx, f.no, markLow); err != nil {
		return 0, err
	}
	buf, n, err := r.read(ctx, f, again)
	if err != nil || n == 0 && !again {
		return 0, err
	}
	if err := r.store.storeChunk(ctx, f, buf, n); err != nil {
		return 0, err
	}
	if err := r.mark(ctx, f.no, markHigh); err != nil {
		return 0, err
	}
	f.at = time.Now()
	return n, nil
}

// read reads f's rows on r.conn as one chunk document (see chunkDoc); n
// is 0 at the end of the table. Unless again, it sets f.end.
func (r *Runner) read(ctx context.Context, f *flight, again bool) (buf []byte, n int, err error) {
	t := r.table
	var conds []string
	var args []any
	if f.start != nil {
		c, a := t.afterKey(f.start)
		conds, args = append(conds, c), append(args, a...)
	}
	if again {
		c, a := t.atMostKey(f.end)
		conds, args = append(conds, c), append(args, a...)
	}
	if r.spec.Where != "" {
		conds = append(conds, "("+r.spec.Where+")")
	}
	q := "SELECT " + t.selectList() + " FROM " + t.qualified()
	if len(conds) > 0 {
		q += " WHERE " + strings.Join(conds, " AND ")
	}
	q += " ORDER BY " + t.orderBy()
	if !again {
		q += fmt.Sprintf(" LIMIT %d", r.spec.ChunkSize)
	}
	rows, err := r.conn.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, 0, fmt.Errorf("read chunk of %s: %w", r.spec.Table, err)
	}
	defer rows.Close()
	keyNames := make([]string, len(t.key))
	for i, k := range t.key {
		keyNames[i] = t.cols[k].name
	}
	sinks, _ := json.Marshal(r.spec.Sinks)
	keyJSON, _ := json.Marshal(keyNames)
	buf = make([]byte, 0, 256*r.spec.ChunkSize)
	buf = fmt.Appendf(buf, `{"db":%q,"table":%q,"key":%s,"sinks":%s,"ts_ms":%d,"rows":[`,
		t.db, t.name, keyJSON, sinks, time.Now().UnixMilli())
	raw := make([]sql.RawBytes, len(t.cols))
	dest := make([]any, len(t.cols))
	for i := range raw {
		dest[i] = &raw[i]
	}
	row := make(canonical.Row, len(t.cols))
	var last keyArgs
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, 0, fmt.Errorf("read chunk of %s: %w", r.spec.Table, err)
		}
		for i := range t.cols {
			v, err := t.cols[i].convert(raw[i])
			if err != nil {
				return nil, 0, fmt.Errorf("read chunk of %s: %w", r.spec.Table, err)
			}
			row[t.cols[i].name] = v
		}
		if n > 0 {
			buf = append(buf, ',')
		}
		if buf, err = canonical.AppendJSON(buf, map[string]any(row)); err != nil {
			return nil, 0, fmt.Errorf("encode row of %s: %w", r.spec.Table, err)
		}
		n++
		last = last[:0]
		for _, k := range t.key {
			last = append(last, append([]byte(nil), raw[k]...))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("read chunk of %s: %w", r.spec.Table, err)
	}
	if n == 0 && !again {
		return nil, 0, nil
	}
	buf = append(buf, "]}"...)
	if !again {
		f.end = last
		f.endJSON = r.keyJSON(last)
	}
	f.rows = n
	return buf, n, nil
}

// keyJSON is the canonical key JSON of a raw key position.
func (r *Runner) keyJSON(k keyArgs) string {
	t := r.table
	key := canonical.Row{}
	for i, c := range t.key {
		if i < len(k) {
			v, _ := t.cols[c].convert(k[i])
			key[t.cols[c].name] = v
		}
	}
	return canonical.KeyJSON(key)
}

// unfinished returns the chunks an earlier run left (read, maybe applied,
// not recorded as done), chained in key order from resume: each starts
// where the one before ends. Anything off the chain is read afresh.
func (r *Runner) unfinished(ctx context.Context, resume string) ([]*flight, error) {
	byStart, err := r.store.chunkRanges(ctx)
	if err != nil {
		return nil, err
	}
	var out []*flight
	for at := resume; ; {
		end, ok := byStart[at]
		if !ok || end == "" {
			return out, nil
		}
		delete(byStart, at) // a cycle cannot loop
		f := &flight{}
		if f.start, err = decodeKeyArgs(at); err != nil {
			return nil, err
		}
		if f.end, err = decodeKeyArgs(end); err != nil {
			return nil, err
		}
		f.endJSON = r.keyJSON(f.end)
		out = append(out, f)
		at = end
	}
}

// mark writes a watermark row on the source, in its own transaction (the
// applier relies on a watermark being alone in its transaction). n changes
// on every write so the server always logs a row event.
func (r *Runner) mark(ctx context.Context, chunk int64, mark string) error {
	if r.keyOrder {
		mark = strings.ToUpper(mark) // markLowOrdered, markHighOrdered
	}
	if _, err := r.conn.ExecContext(ctx, "INSERT INTO "+r.wm+" (id, instance, tbl, chunk, mark, n, updated_at) VALUES (?, ?, ?, ?, ?, 1, NOW(6))"+
		" ON DUPLICATE KEY UPDATE instance = VALUES(instance), tbl = VALUES(tbl), chunk = VALUES(chunk), mark = VALUES(mark), n = n + 1, updated_at = NOW(6)",
		r.id, r.spec.Instance, r.spec.Table, chunk, mark); err != nil {
		return fmt.Errorf("write watermark: %w", err)
	}
	return nil
}

// resume reads where the backfill stands: the key after its completed
// prefix (pos), the next chunk number and the chunks of an earlier run to
// read again (redo); it resets the progress to the rows done.
func (r *Runner) resume(ctx context.Context) (pos keyArgs, next int64, redo []*flight, err error) {
	_, m, err := get(ctx, r.State, r.StateSchema, r.id)
	if err != nil {
		return nil, 0, nil, err
	}
	r.keyOrder = m.KeyOrder
	pos, err = decodeKeyArgs(m.Resume)
	if err != nil {
		return nil, 0, nil, err
	}
	// Chunks of an earlier run beyond the completed prefix are read again
	// over the same key ranges (their rows share one claim per range,
	// dedup.BackfillUnit, so a chunk that reached the outbox before the
	// stop is not written twice) under fresh numbers, so a late high
	// watermark of theirs matches nothing.
	if next, err = r.store.nextChunk(ctx); err != nil {
		return nil, 0, nil, err
	}
	redo, err = r.unfinished(ctx, m.Resume)
	if err != nil {
		return nil, 0, nil, err
	}
	if err := r.store.clear(ctx); err != nil {
		return nil, 0, nil, err
	}
	info, err := Get(ctx, r.State, r.StateSchema, r.id)
	if err != nil {
		return nil, 0, nil, err
	}
	r.started = time.Now()
	r.prog = Progress{ID: r.id, Rows: info.RowsDone, Enqueued: info.RowsDone, Estimate: r.table.estimate}
	if r.OnProgress != nil {
		r.OnProgress(r.prog)
	}
	return pos, next, redo, nil
}

// done records the backfill done and removes its watermark row and chunks.
func (r *Runner) done(ctx context.Context) error {
	if err := r.store.done(ctx); err != nil {
		return err
	}
	if !r.readOnly {
		if _, err := r.conn.ExecContext(ctx, "DELETE FROM "+r.wm+" WHERE id = ?", r.id); err != nil {
			r.Logger.Warn("remove watermark row", zap.Error(err))
		}
	}
	if err := r.store.clear(ctx); err != nil {
		r.Logger.Warn("remove backfill chunks", zap.Error(err))
	}
	return nil
}
