package mysqltest

import (
	"database/sql"
	"testing"
)

// NewSource creates what most capture tests start from: a source
// database prefix… holding one table t of the given columns, an empty
// state database prefix…_state, a connection, and the binlog position
// (GTIDPos) before anything is written to t.
func (s *Server) NewSource(tb testing.TB, prefix, columns string) (db *sql.DB, src, stateDB, from string) {
	tb.Helper()
	src = s.CreateDB(tb, prefix)
	stateDB = s.CreateDB(tb, prefix+"_state")
	s.Exec(tb, "CREATE TABLE `"+src+"`.t ("+columns+")")
	db = s.Open(tb)
	return db, src, stateDB, GTIDPos(tb, db)
}
