package engine

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/outbox"
)

// ddlRecord is what TestDDLRecordsUnderWrites reads of each delivery
// (native format).
type ddlRecord struct {
	ID     string                     `json:"id"`
	Op     string                     `json:"op"`
	After  map[string]json.RawMessage `json:"after"`
	Before map[string]json.RawMessage `json:"before"`
	Source struct {
		Table string `json:"table"`
		File  string `json:"file"`
		Pos   uint32 `json:"pos"`
	} `json:"source"`
	DDL *struct {
		Kind          string   `json:"kind"`
		Table         string   `json:"table"`
		OldTable      string   `json:"old_table"`
		Columns       []ddlCol `json:"columns"`
		ColumnsBefore []ddlCol `json:"columns_before"`
		Statement     string   `json:"statement"`
	} `json:"ddl"`
}

type ddlCol struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Nullable bool   `json:"nullable"`
	Key      string `json:"key"`
}

// String is "name type [null] [key]", display widths dropped (MariaDB
// and MySQL before 8.0.19 print int(11)).
func (c ddlCol) String() string {
	s := c.Name + " " + strings.NewReplacer("int(11)", "int", "bigint(20)", "bigint").Replace(c.Type)
	if c.Nullable {
		s += " null"
	}
	if c.Key != "" {
		s += " " + c.Key
	}
	return s
}

func colsString(cols []ddlCol) string {
	if cols == nil {
		return "<none>"
	}
	s := make([]string, len(cols))
	for i, c := range cols {
		s[i] = c.String()
	}
	return strings.Join(s, ", ")
}

// ddlReceiver is a webhook receiver keeping the first receipt of every
// record in arrival order, failing 5 % of attempts with a 500.
type ddlReceiver struct {
	srv      *httptest.Server
	mu       sync.Mutex
	received []ddlRecord
	seen     map[string]bool
}

func newDDLReceiver(t *testing.T) *ddlReceiver {
	r := &ddlReceiver{seen: map[string]bool{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var rec ddlRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Errorf("body %s: %v", b, err)
			w.WriteHeader(400)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.seen[rec.ID] {
			return // a redelivery
		}
		if rand.IntN(100) < 5 {
			w.WriteHeader(500)
			return
		}
		r.seen[rec.ID] = true
		r.received = append(r.received, rec)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *ddlReceiver) records() []ddlRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.received)
}

func schemaChanges(recs []ddlRecord) []ddlRecord {
	var out []ddlRecord
	for _, r := range recs {
		if r.DDL != nil {
			out = append(out, r)
		}
	}
	return out
}

// ddlWrites commits n transactions of 1–3 random upserts and deletes of
// table (cols: the columns to write) in s's source database.
func ddlWrites(t *testing.T, s source, table, cols string, n int) {
	t.Helper()
	q := "`" + s.src + "`." + table
	for range n {
		tx, err := s.db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for range 1 + rand.IntN(3) {
			id := 1 + rand.IntN(25)
			var stmt string
			var args []any
			switch {
			case rand.IntN(5) == 0:
				stmt, args = "DELETE FROM "+q+" WHERE id = ?", []any{id}
			case cols == "id, v, w":
				stmt, args = "INSERT INTO "+q+" (id, v, w) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE v = VALUES(v), w = VALUES(w)",
					[]any{id, rand.IntN(1000), fmt.Sprint("w", rand.IntN(100))}
			case cols == "id, name":
				stmt, args = "INSERT INTO "+q+" (id, name) VALUES (?, ?) ON DUPLICATE KEY UPDATE name = VALUES(name)",
					[]any{id, fmt.Sprint("n", id, "-", rand.IntN(100))}
			default:
				stmt, args = "INSERT INTO "+q+" (id, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE v = VALUES(v)", []any{id, rand.IntN(1000)}
			}
			if _, err := tx.Exec(stmt, args...); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDDLRecordsUnderWrites: a webhook sink with ddl: true (native
// format) while transactions keep writing between ADD, MODIFY and DROP
// COLUMN, TRUNCATE, RENAME, CREATE and DROP TABLE, the receiver failing
// 5 % of first attempts. Each statement is one record with the right
// column lists after and before it, received after every row change of
// its table committed before it and before every one committed after it
// (binlog positions against arrival order); a consumer applying the
// records in arrival order ends with exactly the source's tables and
// rows, the truncated rows gone. A sink without ddl: gets no such record.
func TestDDLRecordsUnderWrites(t *testing.T) {
	rcv := newDDLReceiver(t)
	plainFile := filepath.Join(t.TempDir(), "plain.jsonl")
	s := newSource(t, "ddlrec", "id INT PRIMARY KEY, v INT", func(cfg *config.Config) {
		cfg.Sinks = []config.Sink{
			{Name: "ddl", URL: rcv.srv.URL, DDL: true, Format: "native", MaxAttempts: 1000, Concurrency: 4, BatchSize: 8},
			{Name: "plain", URL: "file://" + plainFile},
		}
		cfg.EnqueueFlushInterval = 10 * time.Millisecond
	})
	runEngine(t, s.cfg, zaptest.NewLogger(t))
	q := func(name string) string { return "`" + s.src + "`." + name }

	// Each statement, then writes while cdcout reads it; the next
	// statement only once its record arrived, so information_schema still
	// describes the table as the statement left it when cdcout reads it
	// (the documented limit: a reader behind a later DDL of the table gets
	// the later definition).
	steps := []struct {
		stmt, table, cols string // the writes after it
	}{
		{"ALTER TABLE " + q("t") + " ADD COLUMN w VARCHAR(20) NULL", "t", "id, v, w"},
		{"ALTER TABLE " + q("t") + " MODIFY COLUMN v BIGINT NOT NULL", "t", "id, v, w"},
		{"ALTER TABLE " + q("t") + " DROP COLUMN w", "t", "id, v"},
		{"TRUNCATE TABLE " + q("t"), "t", "id, v"},
		{"RENAME TABLE " + q("t") + " TO " + q("t2"), "t2", "id, v"},
		{"CREATE TABLE " + q("t3") + " (id INT PRIMARY KEY, name VARCHAR(10) NOT NULL, UNIQUE KEY (name))", "t3", "id, name"},
		{"DROP TABLE " + q("t3"), "t2", "id, v"},
	}
	ddlWrites(t, s, "t", "id, v", 40)
	for i, st := range steps {
		s.srv.Exec(t, st.stmt)
		ddlWrites(t, s, st.table, st.cols, 30)
		waitFor(t, fmt.Sprintf("the record of %q", st.stmt), 30*time.Second, func() bool { return len(schemaChanges(rcv.records())) > i })
	}
	if _, err := s.db.Exec("INSERT INTO " + q("t2") + " (id, v) VALUES (999, 1)"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the last insert, and every record of the sink delivered", 30*time.Second, func() bool {
		if !slices.ContainsFunc(rcv.records(), func(r ddlRecord) bool { return r.Op == "c" && string(r.After["id"]) == "999" }) {
			return false
		}
		for _, r := range records(t, s.db, s.stateDB, "%:ddl") {
			if r.Status != "delivered" {
				return false
			}
		}
		return true
	})
	recs := rcv.records()

	checkDDLColumns(t, schemaChanges(recs))
	checkDDLOrder(t, recs)
	model := replayDDL(t, recs)
	if names := slices.Sorted(maps.Keys(model)); !slices.Equal(names, []string{"t2"}) {
		t.Fatalf("the consumer ends with tables %v, the source has [t2]", names)
	}
	source := readTable(t, s.db, q("t2"))
	if len(source) != len(model["t2"].rows) {
		t.Errorf("the consumer has %d rows of t2, the source %d", len(model["t2"].rows), len(source))
	}
	for id, v := range source {
		if row := model["t2"].rows[id]; row == nil || string(row["v"]) != v {
			t.Errorf("t2 row %s: consumer %v, source v=%s", id, row, v)
		}
	}
	b, err := os.ReadFile(plainFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"op":"ddl"`) {
		t.Error("the sink without ddl: true got schema-change records")
	}
	t.Logf("%d records, %d schema changes, %d rows of t2 at the end", len(recs), len(schemaChanges(recs)), len(source))
}

// checkDDLColumns compares the statements' records with their column
// lists after and before.
func checkDDLColumns(t *testing.T, got []ddlRecord) {
	t.Helper()
	want := []struct{ kind, table, old, after, before string }{
		{"ALTER", "t", "", "id int PRI, v int null, w varchar(20) null", "id int PRI, v int null"},
		{"ALTER", "t", "", "id int PRI, v bigint, w varchar(20) null", "id int PRI, v int null, w varchar(20) null"},
		{"ALTER", "t", "", "id int PRI, v bigint", "id int PRI, v bigint, w varchar(20) null"},
		{"TRUNCATE", "t", "", "id int PRI, v bigint", "id int PRI, v bigint"},
		{"RENAME", "t2", "t", "id int PRI, v bigint", "id int PRI, v bigint"},
		{"CREATE", "t3", "", "id int PRI, name varchar(10) UNI", "<none>"},
		{"DROP", "t3", "", "<none>", "id int PRI, name varchar(10) UNI"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d schema-change records, want %d", len(got), len(want))
	}
	for i, w := range want {
		d := got[i].DDL
		before := colsString(d.ColumnsBefore)
		if i == 0 && before == "<none>" {
			before = w.before // not known yet: t's definition was never read (MySQL, a primary key)
		}
		if d.Kind != w.kind || d.Table != w.table || d.OldTable != w.old || colsString(d.Columns) != w.after || before != w.before {
			t.Errorf("record %d (%s): %s %s (from %q)\n  columns %s\n  before  %s\nwant %s %s (from %q)\n  columns %s\n  before  %s",
				i, d.Statement, d.Kind, d.Table, d.OldTable, colsString(d.Columns), before, w.kind, w.table, w.old, w.after, w.before)
		}
	}
}

// checkDDLOrder: every row change of a table committed before a
// statement on it arrived before the statement's record, every later one
// after.
func checkDDLOrder(t *testing.T, recs []ddlRecord) {
	t.Helper()
	type at struct {
		file string
		pos  uint32
	}
	less := func(a, b at) bool { return a.file < b.file || a.file == b.file && a.pos < b.pos }
	for i, d := range recs {
		if d.DDL == nil {
			continue
		}
		tables := []string{d.DDL.Table, d.DDL.OldTable}
		dpos := at{d.Source.File, d.Source.Pos}
		for j, r := range recs {
			if r.DDL != nil || !slices.Contains(tables, r.Source.Table) {
				continue
			}
			if before := less(at{r.Source.File, r.Source.Pos}, dpos); before != (j < i) {
				t.Errorf("%s of %s at %s:%d arrived %d, the %s at %s:%d arrived %d: out of order",
					r.Op, r.Source.Table, r.Source.File, r.Source.Pos, j, d.DDL.Kind, dpos.file, dpos.pos, i)
			}
		}
	}
}

// consumerTable is a table as a consumer applying the records keeps it.
type consumerTable struct {
	cols []string
	rows map[string]map[string]json.RawMessage
}

// replayDDL applies the records in arrival order, as a consumer would,
// starting from t (id, v), and checks every row change has the columns
// the last schema-change record of its table lists.
func replayDDL(t *testing.T, recs []ddlRecord) map[string]*consumerTable {
	t.Helper()
	model := map[string]*consumerTable{"t": {cols: []string{"id", "v"}, rows: map[string]map[string]json.RawMessage{}}}
	for _, r := range recs {
		if d := r.DDL; d != nil {
			var names []string
			for _, c := range d.Columns {
				names = append(names, c.Name)
			}
			switch d.Kind {
			case "CREATE":
				model[d.Table] = &consumerTable{cols: names, rows: map[string]map[string]json.RawMessage{}}
			case "DROP":
				delete(model, d.Table)
			case "RENAME":
				model[d.Table] = model[d.OldTable]
				delete(model, d.OldTable)
			case "TRUNCATE":
				clear(model[d.Table].rows)
			case "ALTER":
				tb := model[d.Table]
				tb.cols = names
				for _, row := range tb.rows { // the consumer's own ALTER
					for c := range row {
						if !slices.Contains(names, c) {
							delete(row, c)
						}
					}
				}
			}
			continue
		}
		tb := model[r.Source.Table]
		if tb == nil {
			t.Fatalf("%s of %s arrived while the consumer has no such table", r.Op, r.Source.Table)
		}
		img := r.After
		if r.Op == "d" {
			img = r.Before
		}
		cols := slices.Sorted(maps.Keys(img))
		if want := slices.Sorted(slices.Values(tb.cols)); !slices.Equal(cols, want) {
			t.Errorf("%s of %s has columns %v, the last schema-change record says %v", r.Op, r.Source.Table, cols, want)
		}
		if id := string(img["id"]); r.Op == "d" {
			delete(tb.rows, id)
		} else {
			tb.rows[id] = img
		}
	}
	return model
}

// readTable returns a table's v by id, as canonical JSON text.
func readTable(t *testing.T, db *sql.DB, name string) map[string]string {
	t.Helper()
	rows, err := db.Query("SELECT id, v FROM " + name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, v int64
		if err := rows.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprint(id)] = fmt.Sprint(v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDDLRecordReplay: reading the binlog again from before a statement
// (a restart whose checkpoint is behind it, a takeover) writes no second
// schema-change record: its change key is the same in either identity
// mode and collapses onto its claim.
func TestDDLRecordReplay(t *testing.T) {
	inBothModes(t, func(t *testing.T, mode string) {
		s := newSource(t, "ddlreplay_"+mode, "id INT PRIMARY KEY, v INT", func(cfg *config.Config) {
			cfg.ChangeIdentity = mode
			cfg.Sinks = []config.Sink{{Name: "out", URL: "file://" + filepath.Join(t.TempDir(), "o.jsonl"), DDL: true}}
		})
		from := s.cfg.From
		s.srv.Exec(t, "INSERT INTO `"+s.src+"`.t VALUES (1, 1)",
			"ALTER TABLE `"+s.src+"`.t ADD COLUMN w INT",
			"INSERT INTO `"+s.src+"`.t VALUES (2, 2, 2)")
		ddls := func() (n, rows int) {
			recs, err := outbox.ReadRecords(context.Background(), s.db, s.stateDB, "%")
			if err != nil {
				return 0, 0 // not migrated yet
			}
			for _, r := range recs {
				if r.Op == string(canonical.OpDDL) {
					n++
				} else {
					rows++
				}
			}
			return n, rows
		}
		stop := runEngine(t, s.cfg, zaptest.NewLogger(t))
		waitFor(t, "the record and both rows", 30*time.Second, func() bool { n, rows := ddls(); return n == 1 && rows == 2 })
		stop()
		// Again from before the statement.
		cfg := *s.cfg
		cfg.From, cfg.ResetPosition = from, true
		stop = runEngine(t, &cfg, zaptest.NewLogger(t))
		s.srv.Exec(t, "INSERT INTO `"+s.src+"`.t VALUES (3, 3, 3)")
		waitFor(t, "the row after the restart", 30*time.Second, func() bool { _, rows := ddls(); return rows >= 3 })
		stop()
		if n, rows := ddls(); n != 1 || rows != 3 {
			t.Fatalf("after reading it all again: %d schema-change records and %d rows, want 1 and 3", n, rows)
		}
	})
}
