// Package statetest gives a test a migrated state database on the shared
// test server (internal/mysqltest), the setup most database tests begin
// with.
package statetest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/state"
)

// New creates a database named after prefix on the shared test server,
// migrated to the current state schema and dropped when the test ends. It
// returns a pool to the server (no default database) and the name.
func New(tb testing.TB, prefix string) (*sql.DB, string) {
	tb.Helper()
	srv := mysqltest.Shared(tb)
	schema := srv.CreateDB(tb, prefix)
	db := srv.Open(tb)
	Migrate(tb, db, schema)
	return db, schema
}

// Migrate migrates schema on db to the current state schema, failing the
// test on error.
func Migrate(tb testing.TB, db *sql.DB, schema string) {
	tb.Helper()
	if err := state.Migrate(context.Background(), db, schema); err != nil {
		tb.Fatalf("migrate state database %s: %v", schema, err)
	}
}
