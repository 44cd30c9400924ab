package mysqltest

import (
	"context"
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

// ConnExec runs the statements one after another on conn, failing the
// test on error: XA transactions and session variables belong to one
// connection, which a *sql.DB would not keep between statements.
func ConnExec(tb testing.TB, conn *sql.Conn, stmts ...string) {
	tb.Helper()
	for _, q := range stmts {
		if _, err := conn.ExecContext(context.Background(), q); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
}
