package backfill

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/state"
)

func wmChange(wmDB, id, instance string, chunk int64, mark string) *canonical.Change {
	return &canonical.Change{Op: canonical.OpUpdate, Source: canonical.Source{DB: wmDB, Table: WatermarkTable},
		After: canonical.Row{"id": id, "instance": instance, "tbl": "app.t", "chunk": chunk, "mark": mark}}
}

func rowChange(id int64) *canonical.Change {
	return &canonical.Change{Op: canonical.OpUpdate, Source: canonical.Source{DB: "app", Table: "t"},
		Key: canonical.Row{"id": id}, After: canonical.Row{"id": id, "v": int64(0)}}
}

// TestApplierWindow: keys changed between LOW and HIGH are dropped from the
// chunk, the rest come back as "r" rows at HIGH; the chunk is done only
// after Written for a batch cut after it; a HIGH without its LOW asks for the chunk again; another
// instance's watermarks are consumed but ignored.
func TestApplierWindow(t *testing.T) {
	db, schema := migratedState(t)
	ctx := context.Background()
	doc := `{"db":"app","table":"t","key":["id"],"sinks":["hook"],"ts_ms":1,"rows":[{"id":1,"v":10},{"id":2,"v":20},{"id":3,"v":30}]}`
	for _, chunk := range []int{0, 1} {
		if _, err := db.Exec("INSERT INTO "+state.Table(schema, "backfill_chunks")+" (backfill_id, chunk, rows_json, row_count) VALUES ('bf1', ?, ?, 3)", chunk, doc); err != nil {
			t.Fatal(err)
		}
	}
	status := func(chunk int) string {
		var s string
		if err := db.QueryRow("SELECT status FROM "+state.Table(schema, "backfill_chunks")+" WHERE backfill_id = 'bf1' AND chunk = ?", chunk).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := NewApplier(db, schema, "i1", "test", nil)
	wm := WatermarkDB(schema)
	feed := func(ch *canonical.Change) (bool, []Row) {
		t.Helper()
		consumed, rows, err := a.Change(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		return consumed, rows
	}
	if c, rows := feed(wmChange(wm, "bf1", "i1", 0, markLow)); !c || rows != nil {
		t.Fatalf("LOW: consumed %v rows %v", c, rows)
	}
	if c, _ := feed(rowChange(2)); c {
		t.Fatal("a table change was consumed")
	}
	feed(wmChange(wm, "bfother", "i2", 0, markLow)) // another instance
	mark := a.Handed()                              // a batch cut before the HIGH
	c, rows := feed(wmChange(wm, "bf1", "i1", 0, markHigh))
	if !c || len(rows) != 2 {
		t.Fatalf("HIGH: consumed %v, %d rows, want 2", c, len(rows))
	}
	for i, want := range []int64{1, 3} {
		r := rows[i]
		if got := canonical.KeyJSON(r.Change.Key); got != canonical.KeyJSON(canonical.Row{"id": want}) {
			t.Errorf("row %d key %s, want id %d", i, got, want)
		}
		if r.Change.Op != canonical.OpRead || r.Change.Before != nil || r.Sinks[0] != "hook" || r.ChangeKey[:6] != "b:bf1:" {
			t.Errorf("row %d: %+v", i, r)
		}
	}
	if got := status(0); got != chunkWritten {
		t.Fatalf("chunk 0 %s before Written, want written", got)
	}
	// The batch cut before the HIGH committed: the chunk's rows are in a
	// later batch, still being built or written.
	a.Written(ctx, mark)
	if got := status(0); got != chunkWritten {
		t.Fatalf("chunk 0 %s after a batch cut before it was written, want written", got)
	}
	a.Written(ctx, a.Handed())
	if got := status(0); got != chunkDone {
		t.Fatalf("chunk 0 %s after Written, want done", got)
	}
	// Replay of the same HIGH (a stream read again): nothing twice.
	if _, rows := feed(wmChange(wm, "bf1", "i1", 0, markHigh)); len(rows) != 0 {
		t.Fatalf("replayed HIGH gave %d rows", len(rows))
	}
	// Another state database's watermarks: consumed (never routed), ignored.
	if c, rows := feed(wmChange("elsewhere_watermark", "bf1", "i1", 1, markLow)); !c || rows != nil {
		t.Fatalf("foreign watermark: consumed %v rows %v", c, rows)
	}
	// HIGH of chunk 1 without its LOW: the window is unknown.
	if _, rows := feed(wmChange(wm, "bf1", "i1", 1, markHigh)); len(rows) != 0 {
		t.Fatalf("HIGH without LOW gave %d rows", len(rows))
	}
	if got := status(1); got != chunkRetry {
		t.Fatalf("chunk 1 %s, want retry", got)
	}
}

// TestKeyDigestOrder: ordered change keys sort like the keys (so a chunk's
// claims are inserted next to each other) and stay unique and stable.
func TestKeyDigestOrder(t *testing.T) {
	rows := []canonical.Row{
		{"a": json.Number("-7"), "b": "x"},
		{"a": json.Number("0"), "b": "x"},
		{"a": json.Number("5"), "b": "ab"},
		{"a": json.Number("5"), "b": "abc"},
		{"a": json.Number("1000"), "b": ""},
		{"a": json.Number("18446744073709551615"), "b": ""},
	}
	cols := []string{"a", "b"}
	var prev string
	for i, r := range rows {
		kj := canonical.KeyJSON(r)
		got := keyDigest(kj, cols, r, true)
		if again := keyDigest(kj, cols, r, true); again != got {
			t.Fatalf("row %d: %s then %s", i, got, again)
		}
		if plain := keyDigest(kj, cols, r, false); len(plain) != 64 || !strings.HasSuffix(got, plain) {
			t.Fatalf("row %d: ordered %s does not end in the digest %s", i, got, plain)
		}
		if len(got) != 2*16+64 { // two columns, 8 bytes each
			t.Fatalf("row %d: %d characters", i, len(got))
		}
		if i > 0 && got <= prev {
			t.Fatalf("row %d key %s sorts before the previous row's: %s <= %s", i, kj, got, prev)
		}
		prev = got
	}
	// A column of another type ends the prefix; the digest still decides.
	r := canonical.Row{"a": 1.5}
	if got := keyDigest(canonical.KeyJSON(r), []string{"a"}, r, true); len(got) != 64 {
		t.Fatalf("float key: %s", got)
	}
}

// TestApplierOrderedMarks: upper-case marks give ordered change keys; a
// HIGH whose form differs from its LOW's is not trusted.
func TestApplierOrderedMarks(t *testing.T) {
	db, schema := migratedState(t)
	ctx := context.Background()
	doc := `{"db":"app","table":"t","key":["id"],"sinks":null,"ts_ms":1,"rows":[{"id":1,"v":10},{"id":2,"v":20}]}`
	for _, chunk := range []int{0, 1} {
		if _, err := db.Exec("INSERT INTO "+state.Table(schema, "backfill_chunks")+" (backfill_id, chunk, rows_json, row_count) VALUES ('bf1', ?, ?, 2)", chunk, doc); err != nil {
			t.Fatal(err)
		}
	}
	a := NewApplier(db, schema, "i1", "test", nil)
	wm := WatermarkDB(schema)
	feed := func(ch *canonical.Change) []Row {
		t.Helper()
		_, rows, err := a.Change(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	feed(wmChange(wm, "bf1", "i1", 0, markLowOrdered))
	rows := feed(wmChange(wm, "bf1", "i1", 0, markHighOrdered))
	if len(rows) != 2 || rows[0].Sinks != nil {
		t.Fatalf("HIGH: %d rows (%+v), want 2 for every sink", len(rows), rows)
	}
	if !(rows[0].ChangeKey < rows[1].ChangeKey) || len(rows[0].ChangeKey) != len("b:bf1:")+16+64 {
		t.Fatalf("change keys %s, %s: want ordered, 16+64 characters after the id", rows[0].ChangeKey, rows[1].ChangeKey)
	}
	feed(wmChange(wm, "bf1", "i1", 1, markLow))
	if rows := feed(wmChange(wm, "bf1", "i1", 1, markHighOrdered)); len(rows) != 0 {
		t.Fatalf("HIGH of another form than its LOW gave %d rows", len(rows))
	}
	var s string
	if err := db.QueryRow("SELECT status FROM " + state.Table(schema, "backfill_chunks") + " WHERE backfill_id = 'bf1' AND chunk = 1").Scan(&s); err != nil {
		t.Fatal(err)
	}
	if s != chunkRetry {
		t.Fatalf("chunk 1 %s, want retry", s)
	}
}

// migratedState is a fresh, migrated state database on the shared server.
func migratedState(t *testing.T) (*sql.DB, string) {
	t.Helper()
	srv := mysqltest.Shared(t)
	schema := srv.CreateDB(t, "bfa_state")
	db := srv.Open(t)
	if err := state.Migrate(context.Background(), db, schema); err != nil {
		t.Fatal(err)
	}
	return db, schema
}
