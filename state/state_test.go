package state

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

func TestMain(m *testing.M) { mysqltest.RunMain(m) }

var allTables = []string{"outbox", "segments", "claims", "leases", "checkpoints", "attempts", "replicas", "backfills", "backfill_chunks", "sink_controls", "replays", "replay_pipes", "retention_marks", "backfill_signals", "backfill_fences", "sink_subscriptions", "sink_tables", "schema_migrations", MarkerTable}

func dropAfter(t *testing.T, db *sql.DB, schema string) {
	t.Cleanup(func() { db.Exec("DROP DATABASE IF EXISTS " + quoteIdent(schema)) })
}

func tablesIn(t *testing.T, db *sql.DB, schema string) map[string]bool {
	t.Helper()
	rows, err := db.Query("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = ?", schema)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		got[n] = true
	}
	return got
}

func TestMigrateConcurrentFreshAndAgain(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.Open(t)
	// A name that does not exist yet: Migrate must create the database.
	schema := strings.ReplaceAll(srv.CreateDB(t, "st_conc"), "st_conc", "st_fresh")
	dropAfter(t, db, schema)

	for round := 0; round < 2; round++ {
		var wg sync.WaitGroup
		errs := make([]error, 5)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = Migrate(context.Background(), db, schema)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: replica %d: %v", round, i, err)
			}
		}
		got := tablesIn(t, db, schema)
		for _, name := range allTables {
			if !got[name] {
				t.Fatalf("round %d: table %s missing; have %v", round, name, got)
			}
		}
		if got, want := len(got), len(allTables); got != want {
			t.Fatalf("round %d: %d tables, want %d", round, got, want)
		}
		var n, maxV int
		if err := db.QueryRow("SELECT COUNT(*), MAX(version) FROM "+Table(schema, "schema_migrations")).Scan(&n, &maxV); err != nil {
			t.Fatal(err)
		}
		if n != len(migrations) || maxV != latestVersion() {
			t.Fatalf("round %d: schema_migrations has %d rows up to %d, want %d up to %d", round, n, maxV, len(migrations), latestVersion())
		}
	}
}

// A replica that died between a CREATE TABLE and recording the version
// must be able to finish on the next start.
func TestMigrateResumesHalfDoneVersion(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.Open(t)
	schema := srv.CreateDB(t, "st_half")
	for _, stmt := range migrations[0].stmts(schema)[:2] {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := Migrate(context.Background(), db, schema); err != nil {
		t.Fatal(err)
	}
	got := tablesIn(t, db, schema)
	for _, name := range allTables {
		if !got[name] {
			t.Fatalf("table %s missing", name)
		}
	}
}

func TestMigrateUsableSchema(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.Open(t)
	schema := srv.CreateDB(t, "st_use")
	if err := Migrate(context.Background(), db, schema); err != nil {
		t.Fatal(err)
	}
	// The claims primary key is the dedup arbiter: a second INSERT IGNORE of
	// the same (pipe, change_key) must not add a row.
	for i := 0; i < 2; i++ {
		if _, err := db.Exec("INSERT IGNORE INTO "+Table(schema, "claims")+" (pipe, change_key, digest, claimed_by) VALUES (?,?,?,?)",
			"i:db.t:s", "g:0-1-1:0", strings.Repeat("a", 64), "r1"); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + Table(schema, "claims")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("claims rows = %d, want 1", n)
	}
	// Pipes differing only in case are different pipes.
	if _, err := db.Exec("INSERT INTO "+Table(schema, "claims")+" (pipe, change_key, digest, claimed_by) VALUES (?,?,?,?)",
		"i:DB.t:s", "g:0-1-1:0", strings.Repeat("a", 64), "r1"); err != nil {
		t.Fatalf("case-distinct pipe rejected: %v", err)
	}
}

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"cdcout", true},
		{"Cdc_Out_2", true},
		{"", false},
		{"cdc-out", false},
		{"cdc`out", false},
		{"cdc.out", false},
		{"cdcöut", false},
		{strings.Repeat("a", 64), true},
		{strings.Repeat("a", 65), false},
	} {
		err := CheckName(tc.name)
		if got := err == nil; got != tc.ok {
			t.Errorf("CheckName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	if err := Migrate(context.Background(), nil, "bad-name"); err == nil || !strings.Contains(err.Error(), "bad-name") {
		t.Fatalf("Migrate with bad name: %v", err)
	}
}

func TestTable(t *testing.T) {
	if got, want := Table("cdcout", "outbox"), "`cdcout`.`outbox`"; got != want {
		t.Fatalf("Table = %q, want %q", got, want)
	}
}

func TestLockNameBounded(t *testing.T) {
	if got := lockName(strings.Repeat("x", 64)); len(got) > 64 {
		t.Fatalf("lock name %q longer than 64", got)
	}
	if got, want := lockName("cdcout"), "cdcout.migrate"; got != want {
		t.Fatalf("lockName = %q, want %q", got, want)
	}
}
