package binlog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// ddlSteps are writes with schema changes between them: ADD COLUMN, DROP
// COLUMN, a column reorder (MODIFY … AFTER) and RENAME TABLE. want is each
// step's change as "op table before after" in canonical JSON.
type ddlStep struct {
	stmts []string
	want  []string
}

func ddlSteps(db string) []ddlStep {
	q := func(s string) string { return strings.ReplaceAll(s, "DB", "`"+db+"`") }
	return []ddlStep{
		{[]string{q("INSERT INTO DB.t VALUES (1, 'a1', 10)")},
			[]string{`c t null {"a":"a1","b":10,"id":1}`}},
		{[]string{q("ALTER TABLE DB.t ADD COLUMN c VARCHAR(10) NULL"), q("INSERT INTO DB.t VALUES (2, 'a2', 20, 'c2')")},
			[]string{`c t null {"a":"a2","b":20,"c":"c2","id":2}`}},
		{[]string{q("ALTER TABLE DB.t DROP COLUMN a"), q("INSERT INTO DB.t VALUES (3, 30, 'c3')")},
			[]string{`c t null {"b":30,"c":"c3","id":3}`}},
		// Reorder to (id, c, b): decoded with the old order, "c4" would
		// land in b and 40 in c.
		{[]string{q("ALTER TABLE DB.t MODIFY b INT AFTER c"), q("INSERT INTO DB.t VALUES (4, 'c4', 40)")},
			[]string{`c t null {"b":40,"c":"c4","id":4}`}},
		{[]string{q("RENAME TABLE DB.t TO DB.t2"), q("UPDATE DB.t2 SET b = 41 WHERE id = 4")},
			[]string{`u t2 {"b":40,"c":"c4","id":4} {"b":41,"c":"c4","id":4}`}},
		{[]string{q("DELETE FROM DB.t2 WHERE id = 1")},
			[]string{`d t2 {"b":10,"c":null,"id":1} null`}},
	}
}

func describe(t *testing.T, evs []Event) []string {
	var out []string
	for _, ch := range changesOf(evs) {
		out = append(out, fmt.Sprintf("%s %s %s %s", ch.Op, ch.Source.Table, jsonOf(t, ch.Before), jsonOf(t, ch.After)))
	}
	return out
}

func wantAll(steps []ddlStep) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.want...)
	}
	return out
}

func checkLines(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestDDLFullMetadata: with binlog_row_metadata=FULL every change decodes
// with the schema it was written under, even when the reader only starts
// after all the DDL ran.
func TestDDLFullMetadata(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "ddlfull")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, a VARCHAR(10), b INT)")
	from := mysqltest.GTIDPos(t, srv.Open(t))
	steps := ddlSteps(db)
	for _, st := range steps {
		srv.Exec(t, st.stmts...)
	}
	cfg := testConfig(t, srv, db)
	cfg.From = from
	s := openStream(t, cfg)
	if got, want := s.Info().MetadataMode, "binlog"; got != want {
		t.Fatalf("metadata mode %q, want %q", got, want)
	}
	c := collect(t, s)
	want := wantAll(steps)
	checkLines(t, describe(t, c.waitChanges(t, len(want))), want)
}

// TestDDLFallbackCaughtUp: without FULL metadata (a server with
// binlog_row_metadata=MINIMAL) names come from information_schema. What is
// guaranteed: a reader that has reached each DDL before the table changes
// again decodes every row correctly, because the schema cache is dropped
// at each DDL event and re-read at the next table map.
func TestDDLFallbackCaughtUp(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{RowMetadata: "MINIMAL"})
	db := srv.CreateDB(t, "ddlfb")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, a VARCHAR(10), b INT)")
	s := openStream(t, testConfig(t, srv, db))
	if got, want := s.Info().MetadataMode, "information_schema"; got != want {
		t.Fatalf("metadata mode %q, want %q", got, want)
	}
	c := collect(t, s)
	steps := ddlSteps(db)
	n := 0
	for _, st := range steps {
		srv.Exec(t, st.stmts...)
		n += len(st.want)
		c.waitChanges(t, n)
		// The DDL of the next step must come after the reader passed this
		// commit: wait for it too.
		c.waitFor(t, func(evs []Event) bool { return evs[len(evs)-1].Commit != nil }, "commit of step")
	}
	checkLines(t, describe(t, c.snapshot()), wantAll(steps))
}

// TestDDLFallbackLagging: a fallback reader that reaches rows written
// before a DDL it has not read yet cannot know their names; it stops with
// an error that says why and what to do rather than decoding them under
// today's column list.
func TestDDLFallbackLagging(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "ddllag")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, a VARCHAR(10), b INT)")
	from := mysqltest.GTIDPos(t, srv.Open(t))
	srv.Exec(t,
		"INSERT INTO `"+db+"`.t VALUES (1, 'a1', 10)",
		"ALTER TABLE `"+db+"`.t ADD COLUMN c VARCHAR(10) NULL",
		"INSERT INTO `"+db+"`.t VALUES (2, 'a2', 20, 'c2')",
	)
	cfg := testConfig(t, srv, db)
	cfg.From = from
	cfg.ForceSchemaFallback = true
	s := openStream(t, cfg)
	if got, want := s.Info().MetadataMode, "information_schema"; got != want {
		t.Fatalf("metadata mode %q, want %q", got, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var changes int
	err := s.Run(ctx, func(_ context.Context, ev Event) error {
		if ev.Change != nil {
			changes++
		}
		return nil
	})
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "binlog_row_metadata=FULL") {
		t.Fatalf("run: %v, want a schema mismatch error", err)
	}
	if changes != 0 {
		t.Fatalf("%d changes emitted before the error, want 0", changes)
	}
	t.Logf("refused as expected: %v", err)
}
