package mysqltest

import (
	"database/sql"
	"testing"
)

// ExecTx runs the statements in one transaction on db and commits it,
// failing the test on error: a test that needs changes to share one
// binlog transaction (one GTID, one commit) writes them this way.
func ExecTx(tb testing.TB, db *sql.DB, stmts ...string) {
	tb.Helper()
	tx, err := db.Begin()
	if err != nil {
		tb.Fatal(err)
	}
	for _, q := range stmts {
		if _, err := tx.Exec(q); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		tb.Fatal(err)
	}
}
