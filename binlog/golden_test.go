package binlog

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

var updateGolden = flag.Bool("update", false, "rewrite binlog/testdata/*.golden.jsonl from this run")

// The golden database and table names are fixed (they appear in every
// envelope), which is why the test runs on a server of its own.
const (
	goldenDB  = "cdcout_golden"
	goldenCtl = "cdcout_golden_ctl"
)

// TestGoldenTypes streams testdata/types.sql's changes — every MySQL type
// with edge values, inserts, updates and deletes, keyed and keyless tables —
// and compares the envelopes byte for byte with testdata/types.golden.jsonl
// (types.golden.mysql.jsonl on MySQL).
// It runs the script twice, on a dropped and re-created database of the
// same name, and requires identical bytes and digests: the same change must
// look the same on every run and every replica.
func TestGoldenTypes(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{})
	script, err := os.ReadFile(filepath.Join("testdata", "types.sql"))
	if err != nil {
		t.Fatal(err)
	}
	stmts := splitSQL(string(script))

	first, firstDigests, _ := goldenRun(t, srv, stmts, 1, false)
	second, secondDigests, changes := goldenRun(t, srv, stmts, 2, false)
	// Independently of the golden file: the final image of every keyed
	// row must say what the server says when asked with SELECT.
	checkAgainstServer(t, srv, changes)

	if !bytes.Equal(first, second) {
		t.Fatalf("two runs of the same script gave different envelopes:\n%s", firstDiff(first, second))
	}
	if len(firstDigests) != len(secondDigests) {
		t.Fatalf("digest count %d vs %d", len(firstDigests), len(secondDigests))
	}
	for i := range firstDigests {
		if firstDigests[i] != secondDigests[i] {
			t.Fatalf("change %d: digest %s in run 1, %s in run 2", i, firstDigests[i], secondDigests[i])
		}
	}

	// The information_schema fallback (servers without
	// binlog_row_metadata=FULL) must decode to the same bytes.
	third, thirdDigests, _ := goldenRun(t, srv, stmts, 3, true)
	if !bytes.Equal(first, third) {
		t.Errorf("information_schema fallback decodes differently from binlog metadata:\n%s", firstDiff(first, third))
	} else if !slices.Equal(firstDigests, thirdDigests) {
		t.Errorf("information_schema fallback gives other digests")
	}

	// The flavours store some values differently (MySQL clamps TIME(1)
	// 838:59:59.9 to 838:59:59.0; MariaDB's JSON is text), so each has
	// its golden file.
	path := filepath.Join("testdata", "types.golden.jsonl")
	if srv.Flavor == mysqltest.MySQL {
		path = filepath.Join("testdata", "types.golden.mysql.jsonl")
	}
	if *updateGolden {
		if err := os.WriteFile(path, first, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d changes)", path, len(firstDigests))
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(first, want) {
		t.Fatalf("envelopes differ from %s (review, then -update if intended):\n%s", path, firstDiff(want, first))
	}
}

// goldenRun creates the golden database afresh, streams the script's
// changes and returns them as normalised JSONL plus each change's digest.
func goldenRun(t *testing.T, srv *mysqltest.Server, stmts []string, run int, fallback bool) ([]byte, []string, []*canonical.Change) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := srv.Open(t)
	for _, q := range []string{
		"DROP DATABASE IF EXISTS " + goldenDB,
		"DROP DATABASE IF EXISTS " + goldenCtl,
		"CREATE DATABASE " + goldenDB + " CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci",
		"CREATE DATABASE " + goldenCtl,
		"CREATE TABLE " + goldenCtl + ".done (run INT PRIMARY KEY)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	s, err := Open(ctx, Config{
		DSN:             srv.DSN,
		ServerID:        uint32(7100 + run),
		From:            "now",
		Include:         []string{goldenDB + ".*", goldenCtl + ".*"},
		Instance:        "golden",
		Version:         "test",
		HeartbeatPeriod: time.Second,
		ReadTimeout:     10 * time.Second,
		Logger:          zaptest.NewLogger(t),

		ForceSchemaFallback: fallback,
	})
	if err != nil {
		t.Fatalf("open stream: %v", err)
	}
	defer s.Close()

	var changes []*canonical.Change
	errDone := errors.New("sentinel seen")
	runErr := make(chan error, 1)
	go func() {
		runErr <- s.Run(ctx, func(_ context.Context, ev Event) error {
			c := ev.Change
			if c == nil {
				return nil
			}
			if c.Source.DB == goldenCtl {
				return errDone
			}
			changes = append(changes, c)
			return nil
		})
	}()

	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	execAll(ctx, t, conn, append([]string{"USE " + goldenDB}, stmts...))
	if _, err := conn.ExecContext(ctx, "INSERT INTO "+goldenCtl+".done VALUES (?)", run); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; !errors.Is(err, errDone) {
		t.Fatalf("run %d: stream ended with %v after %d changes", run, err, len(changes))
	}

	var out bytes.Buffer
	digests := make([]string, 0, len(changes))
	for i, c := range changes {
		if c.Source.GTID == "" {
			t.Fatalf("change %d has no GTID (the test servers always write them)", i)
		}
		if got, want := c.ChangeKey, "g:"+c.Source.GTID+":"+strconv.Itoa(c.Source.Row); got != want {
			t.Fatalf("change %d: change_key %q, want %q", i, got, want)
		}
		if c.TsMs == 0 || c.Source.TsMs == 0 || c.Source.File == "" || c.Source.Pos == 0 {
			t.Fatalf("change %d: volatile field unset: %+v", i, c.Source)
		}
		pipe := "golden:" + c.Source.DB + "." + c.Source.Table + ":test"
		d := canonical.DigestChange(pipe, c)
		if d == "" {
			t.Fatalf("change %d: no digest", i)
		}
		digests = append(digests, d)

		// What differs between runs only because of where and when it
		// ran is fixed; everything decoded from the rows is kept.
		n := *c
		n.TsMs, n.Source.TsMs = 0, 0
		n.Source.File, n.Source.Pos, n.Source.GTID, n.Source.ServerID = "", 0, "", 0
		n.ChangeKey = ""
		b, err := canonical.MarshalEnvelope(&n, "")
		if err != nil {
			t.Fatalf("change %d: %v", i, err)
		}
		out.Write(b)
		out.WriteByte('\n')
	}
	return out.Bytes(), digests, changes
}

func execAll(ctx context.Context, t *testing.T, conn *sql.Conn, stmts []string) {
	t.Helper()
	for _, q := range stmts {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// splitSQL splits a script into statements: a statement ends with ';' at
// the end of a line; lines starting with "--" are comments.
func splitSQL(script string) []string {
	var stmts []string
	var cur strings.Builder
	for _, line := range strings.Split(script, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			q := strings.TrimSpace(cur.String())
			stmts = append(stmts, strings.TrimSuffix(q, ";"))
			cur.Reset()
		}
	}
	return stmts
}

// firstDiff shows the first differing line of two JSONL documents.
func firstDiff(want, got []byte) string {
	wl := strings.Split(string(want), "\n")
	gl := strings.Split(string(got), "\n")
	for i := 0; i < max(len(wl), len(gl)); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("line %d:\nwant %s\ngot  %s", i+1, w, g)
		}
	}
	return "(no line differs)"
}

// checkAgainstServer replays the changes of keyed tables into final row
// images and compares them with SELECT, column by column, each type read
// back in a form the server prints itself (CAST AS CHAR, raw bytes, text
// converted to utf8mb4). It proves the decoded values are the stored ones,
// not merely the same as last time.
func checkAgainstServer(t *testing.T, srv *mysqltest.Server, changes []*canonical.Change) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	state := map[string]map[string]canonical.Row{} // table → key JSON → row
	for _, c := range changes {
		key := c.KeyRow()
		if key == nil {
			continue
		}
		tbl := state[c.Source.Table]
		if tbl == nil {
			tbl = map[string]canonical.Row{}
			state[c.Source.Table] = tbl
		}
		if c.Before != nil {
			delete(tbl, canonical.KeyJSON(project(c.Before, key)))
		}
		if c.After != nil {
			tbl[canonical.KeyJSON(project(c.After, key))] = c.After
		}
	}
	conn, err := srv.Open(t).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET time_zone = '+00:00'"); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for table, rows := range state {
		type col struct{ name, dataType, expr string }
		var cols []col
		res, err := conn.QueryContext(ctx, "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION", goldenDB, table)
		if err != nil {
			t.Fatal(err)
		}
		for res.Next() {
			var c col
			if err := res.Scan(&c.name, &c.dataType); err != nil {
				t.Fatal(err)
			}
			q := "`" + c.name + "`"
			switch c.dataType {
			case "tinyint", "smallint", "mediumint", "int", "bigint", "bit", "year":
				c.expr = "CAST(" + q + "+0 AS CHAR)"
			case "char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set":
				c.expr = "CONVERT(" + q + " USING utf8mb4)"
			case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob", "geometry", "point", "linestring", "polygon":
				c.expr = q
			default: // decimal, float, double, date, datetime, timestamp, time
				c.expr = "CAST(" + q + " AS CHAR)"
			}
			cols = append(cols, c)
		}
		res.Close()
		var server []string
		exprs := make([]string, len(cols))
		for i, c := range cols {
			exprs[i] = c.expr
		}
		res, err = conn.QueryContext(ctx, "SELECT "+strings.Join(exprs, ", ")+" FROM "+goldenDB+"."+table)
		if err != nil {
			t.Fatal(err)
		}
		for res.Next() {
			vals, err := scanRaw(res, len(cols))
			if err != nil {
				t.Fatal(err)
			}
			var line []string
			for i, c := range cols {
				v := "NULL"
				if vals[i] != nil {
					v = serverForm(t, c.dataType, string(vals[i]))
				}
				line = append(line, c.name+"="+v)
			}
			server = append(server, strings.Join(line, " | "))
		}
		res.Close()
		var streamed []string
		for _, row := range rows {
			var line []string
			for _, c := range cols {
				line = append(line, c.name+"="+streamedForm(t, c.dataType, row[c.name]))
			}
			streamed = append(streamed, strings.Join(line, " | "))
		}
		slices.Sort(server)
		slices.Sort(streamed)
		if len(server) != len(streamed) {
			t.Fatalf("table %s: server has %d rows, the stream's final images %d", table, len(server), len(streamed))
		}
		for i := range server {
			if server[i] != streamed[i] {
				t.Errorf("table %s: row differs from SELECT:\nserver   %q\nstreamed %q", table, server[i], streamed[i])
			}
			checked++
		}
	}
	if checked < 20 {
		t.Fatalf("only %d rows compared with the server", checked)
	}
}

// project picks the key columns' values out of a row image.
func project(row, key canonical.Row) canonical.Row {
	out := make(canonical.Row, len(key))
	for k := range key {
		out[k] = row[k]
	}
	return out
}

// serverForm turns SELECT text into the documented canonical text form.
func serverForm(t *testing.T, dataType, v string) string {
	switch dataType {
	case "datetime":
		return strings.Replace(v, " ", "T", 1)
	case "timestamp":
		return strings.Replace(v, " ", "T", 1) + "Z"
	case "float", "double":
		bits := 64
		if dataType == "float" {
			bits = 32
		}
		f, err := strconv.ParseFloat(v, bits)
		if err != nil {
			t.Fatalf("server %s %q: %v", dataType, v, err)
		}
		return strconv.FormatFloat(f, 'g', -1, bits)
	case "longtext", "json":
		// JSON (MySQL's, and MariaDB's LONGTEXT): compare canonically —
		// numbers as the server prints them, so a DOUBLE 1.0 must stay
		// 1.0; plain LONGTEXT (never valid JSON in the script) as is.
		if b, err := canonical.Marshal(canonical.RawJSON(v)); err == nil {
			return string(b)
		}
	case "set":
		if v == "" {
			return "[]"
		}
		return "[" + v + "]"
	}
	return v
}

// streamedForm renders a decoded value the way serverForm renders SELECT's.
func streamedForm(t *testing.T, dataType string, v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case string:
		return x
	case []byte:
		return string(x)
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case []any:
		parts := make([]string, len(x))
		for i, p := range x {
			parts[i] = p.(string)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case canonical.RawJSON:
		b, err := canonical.Marshal(x)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	b, err := canonical.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
