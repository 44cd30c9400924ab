package backfill

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/dedup"
	"github.com/cdcout/cdcout/state"
)

// Row is one backfilled row to enqueue at the stream position where the
// Applier returned it.
type Row struct {
	// Change is an op "r" change (Before nil).
	Change *canonical.Change
	// ChangeKey is dedup.BackfillKey(backfill id, key digest).
	ChangeKey string
	// Unit is the claim the rows of the chunk share (dedup.BackfillUnit).
	Unit string
	// Sinks are the sinks the backfill selected; nil means every sink
	// whose subscription matches the table.
	Sinks []string
}

// chunkDoc is a chunk as stored in backfill_chunks.rows_json:
// {"db":…,"table":…,"key":[…],"sinks":[…],"ts_ms":…,"rows":[{…},…]}.
type chunkDoc struct {
	DB, Table string
	Key       []string
	Sinks     []string // nil: every subscribed sink
	TsMs      int64
	Rows      []any // canonical.ParseJSON values
}

// parseChunk decodes a stored chunk in one pass (the rows are most of it).
func parseChunk(raw []byte) (chunkDoc, error) {
	v, err := canonical.ParseJSON(raw)
	if err != nil {
		return chunkDoc{}, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return chunkDoc{}, errors.New("not a JSON object")
	}
	var d chunkDoc
	d.DB, _ = m["db"].(string)
	d.Table, _ = m["table"].(string)
	d.Key, ok = stringList(m["key"])
	if !ok || len(d.Key) == 0 {
		return chunkDoc{}, errors.New("no key columns")
	}
	if d.Sinks, ok = stringList(m["sinks"]); !ok {
		return chunkDoc{}, errors.New("bad sinks")
	}
	if d.TsMs, ok = asInt(m["ts_ms"]); !ok {
		return chunkDoc{}, errors.New("bad ts_ms")
	}
	if d.Rows, ok = m["rows"].([]any); !ok {
		return chunkDoc{}, errors.New("no rows")
	}
	return d, nil
}

// stringList is a JSON array of strings; null is nil.
func stringList(v any) ([]string, bool) {
	if v == nil {
		return nil, true
	}
	l, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, len(l))
	for i, e := range l {
		if out[i], ok = e.(string); !ok {
			return nil, false
		}
	}
	return out, true
}

// window is an open LOW..HIGH bracket of one backfill.
type window struct {
	chunk     int64
	ordered   bool // change keys with the key's order prefix
	db, table string
	changed   map[string]struct{} // canonical key JSON
}

type chunkRef struct {
	id      string
	chunk   int64
	emitted int
	seq     int // Handed before it was handed out
}

// Applier is the stream side of backfills: the enqueuer of the process
// holding the enqueue lease shows it every change in stream order
// (Change) and tells it which chunks are in committed enqueue
// transactions (Handed, Written).
// One Applier serves one stream (one lease tenure); it is not safe for
// concurrent use, the enqueuer serialises its calls.
type Applier struct {
	db         *sql.DB // state database
	chunks     string  // qualified backfill_chunks
	wmDB       string
	instance   string
	version    string
	log        *zap.Logger
	windows    map[string]*window // by backfill id
	emitted    []chunkRef         // handed out, not yet known durable
	handed     int                // chunks handed out so far
	maxChanged int
	// Read-only backfills (fence.go): the qualified backfill_fences, the
	// open windows, the last poll and when a poll last found a fence.
	fences    string
	ro        map[fenceRef]*roWindow
	polled    time.Time
	lastFence time.Time
}

// NewApplier returns the Applier of a stream of instance whose state
// database is stateSchema on db.
func NewApplier(db *sql.DB, stateSchema, instance, version string, logger *zap.Logger) *Applier {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Applier{
		db:         db,
		chunks:     state.Table(stateSchema, "backfill_chunks"),
		wmDB:       WatermarkDB(stateSchema),
		instance:   instance,
		version:    version,
		log:        logger.Named("backfill"),
		windows:    map[string]*window{},
		maxChanged: 1_000_000,
		fences:     state.Table(stateSchema, "backfill_fences"),
		ro:         map[fenceRef]*roWindow{},
	}
}

// WatermarkTable is the "db.table" the stream must decode for this
// Applier to see watermarks.
func (a *Applier) WatermarkTable() string { return a.wmDB + "." + WatermarkTable }

// Change looks at one decoded change. consumed reports a watermark row,
// which must never be routed to a sink. rows are backfilled rows to enqueue
// now, before any later change of the stream.
func (a *Applier) Change(ctx context.Context, ch *canonical.Change) (consumed bool, rows []Row, err error) {
	if ch.Source.Table == WatermarkTable && strings.HasSuffix(ch.Source.DB, watermarkSuffix) {
		if ch.Source.DB != a.wmDB {
			// Another deployment's watermarks (another state database
			// on the same source): never routed, never applied here.
			return true, nil, nil
		}
		rows, err := a.watermark(ctx, ch)
		return true, rows, err
	}
	for id, w := range a.windows {
		if w.db != ch.Source.DB || w.table != ch.Source.Table {
			continue
		}
		if len(w.changed) >= a.maxChanged {
			// A write storm inside one window: give the chunk up rather
			// than grow without bound; the runner reads it again.
			a.log.Warn("too many changes inside a backfill window; chunk will be read again",
				zap.String("backfill", id), zap.Int64("chunk", w.chunk))
			delete(a.windows, id)
			if err := a.markRetry(ctx, id, w.chunk); err != nil {
				return false, nil, err
			}
			continue
		}
		w.changed[canonical.KeyJSONOf(ch)] = struct{}{}
	}
	if len(a.ro) > 0 {
		if err := a.noteReadOnly(ctx, ch); err != nil {
			return false, nil, err
		}
	}
	return false, nil, nil
}

func (a *Applier) watermark(ctx context.Context, ch *canonical.Change) ([]Row, error) {
	if ch.After == nil {
		return nil, nil // cleanup of the watermark row
	}
	id, _ := ch.After["id"].(string)
	inst, _ := ch.After["instance"].(string)
	mark, _ := ch.After["mark"].(string)
	tbl, _ := ch.After["tbl"].(string)
	chunk, ok := asInt(ch.After["chunk"])
	if id == "" || !ok || inst != a.instance {
		return nil, nil // another instance's backfill
	}
	switch mark {
	case markLow, markLowOrdered:
		db, name, _ := strings.Cut(tbl, ".")
		a.windows[id] = &window{chunk: chunk, ordered: mark == markLowOrdered, db: db, table: name, changed: map[string]struct{}{}}
		return nil, nil
	case markHigh, markHighOrdered:
		w := a.windows[id]
		delete(a.windows, id)
		if w == nil || w.chunk != chunk || w.ordered != (mark == markHighOrdered) {
			// This stream started between the chunk's LOW and HIGH: the
			// window is unknown, so no row of it can be trusted.
			a.log.Info("high watermark without its low one; chunk will be read again",
				zap.String("backfill", id), zap.Int64("chunk", chunk))
			return nil, a.markRetry(ctx, id, chunk)
		}
		return a.emit(ctx, id, w)
	}
	return nil, nil
}

func (a *Applier) emit(ctx context.Context, id string, w *window) ([]Row, error) {
	var (
		raw        []byte
		start, end sql.NullString
	)
	err := a.db.QueryRowContext(ctx, "SELECT rows_json, start_key, end_key FROM "+a.chunks+" WHERE backfill_id = ? AND chunk = ? AND status = ?",
		id, w.chunk, chunkWritten).Scan(&raw, &start, &end)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil // done already (a replay), retried or cancelled
	}
	if err != nil {
		return nil, fmt.Errorf("load backfill %s chunk %d: %w", id, w.chunk, err)
	}
	doc, err := parseChunk(raw)
	if err != nil {
		return nil, fmt.Errorf("decode backfill %s chunk %d: %w", id, w.chunk, err)
	}
	now := time.Now().UnixMilli()
	unit := dedup.BackfillUnit(id, start.String, end.String)
	out := make([]Row, 0, len(doc.Rows))
	for i, v := range doc.Rows {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("decode backfill %s chunk %d row %d: not a JSON object", id, w.chunk, i)
		}
		after := canonical.Row(m)
		key := make(canonical.Row, len(doc.Key))
		for _, k := range doc.Key {
			key[k] = after[k]
		}
		kj := canonical.KeyJSON(key)
		if _, changed := w.changed[kj]; changed {
			continue // the stream already carries a newer state of this key
		}
		digest := keyDigest(kj, doc.Key, after, w.ordered)
		out = append(out, Row{
			Change: &canonical.Change{
				Op: canonical.OpRead, After: after, Key: key,
				Source: canonical.Source{Connector: "cdcout", Version: a.version, Instance: a.instance,
					DB: doc.DB, Table: doc.Table, Row: i, TsMs: doc.TsMs},
				TsMs: now,
			},
			ChangeKey: dedup.BackfillKey(id, digest),
			Unit:      unit,
			Sinks:     doc.Sinks,
		})
	}
	a.emitted = append(a.emitted, chunkRef{id: id, chunk: w.chunk, emitted: len(out), seq: a.handed})
	a.handed++
	return out, nil
}

// orderPrefixBytes bounds the order prefix: 48 hex characters keep a change
// key (b:<24-character id>:<prefix><64-character digest>) far below the
// claims' 191.
const orderPrefixBytes = 24

// keyDigest is the part of a row's change key that identifies the row: the
// SHA-256 of its canonical key JSON, after (ordered) a hex prefix that
// sorts roughly like the key: 8 bytes per key column, integers big-endian
// with the sign bit flipped, strings by their first bytes, until a column
// of another type. The claims primary key is (pipe, change_key): with the
// digest alone a chunk's claims land at random places in it, and on a
// table of a million rows those random inserts cost the database about 2.5
// times the time of inserts next to the previous chunk's (BenchmarkBackfill).
func keyDigest(keyJSON string, cols []string, row canonical.Row, ordered bool) string {
	sum := sha256.Sum256([]byte(keyJSON))
	if !ordered {
		return hex.EncodeToString(sum[:])
	}
	var b []byte
cols:
	for _, c := range cols {
		if len(b) >= orderPrefixBytes {
			break
		}
		switch v := row[c].(type) {
		case json.Number:
			if n, err := v.Int64(); err == nil {
				b = binary.BigEndian.AppendUint64(b, uint64(n)^1<<63)
			} else if u, err := strconv.ParseUint(string(v), 10, 64); err == nil {
				b = binary.BigEndian.AppendUint64(b, u)
			} else {
				break cols
			}
		case string:
			var s [8]byte
			copy(s[:], v)
			b = append(b, s[:]...)
		default:
			break cols
		}
	}
	return hex.EncodeToString(b[:min(len(b), orderPrefixBytes)]) + hex.EncodeToString(sum[:])
}

// Handed counts the chunks Change handed out so far: the mark an enqueue
// batch cut now passes to Written once it commits.
func (a *Applier) Handed() int { return a.handed }

// Written is told that an enqueue transaction committed which holds every
// row of the chunks handed out before mark (Handed when the batch was
// cut), so those chunks are done. Chunks handed out later may still be in
// a batch not yet written (the enqueuer reads on while one is in flight)
// and stay as they are. A crash before this marks nothing; the runner then
// reads the chunk again and its rows collapse on their claims.
func (a *Applier) Written(ctx context.Context, mark int) {
	for len(a.emitted) > 0 && a.emitted[0].seq < mark {
		c := a.emitted[0]
		if _, err := a.db.ExecContext(ctx, "UPDATE "+a.chunks+" SET status = ?, emitted = ?, rows_json = NULL, updated_at = NOW(6) WHERE backfill_id = ? AND chunk = ? AND status = ?",
			chunkDone, c.emitted, c.id, c.chunk, chunkWritten); err != nil {
			a.log.Warn("mark backfill chunk done; the runner will read it again", zap.String("backfill", c.id), zap.Int64("chunk", c.chunk), zap.Error(err))
			return
		}
		a.emitted = a.emitted[1:]
	}
}

func (a *Applier) markRetry(ctx context.Context, id string, chunk int64) error {
	if _, err := a.db.ExecContext(ctx, "UPDATE "+a.chunks+" SET status = ?, rows_json = NULL, updated_at = NOW(6) WHERE backfill_id = ? AND chunk = ? AND status = ?",
		chunkRetry, id, chunk, chunkWritten); err != nil {
		return fmt.Errorf("mark backfill %s chunk %d for retry: %w", id, chunk, err)
	}
	return nil
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case uint64:
		return int64(x), true
	case json.Number:
		n, err := x.Int64()
		return n, err == nil
	}
	return 0, false
}
