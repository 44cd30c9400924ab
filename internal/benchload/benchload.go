// Package benchload writes the benchmark workloads (issue 19) into a table
// on a test server: a realistic mix of inserts, updates and deletes on
// rows shaped like an application's, a JSON-heavy variant and a wide
// 40-column one, so every stage's benchmark reads the same binlog.
package benchload

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// Workload is a table and how its rows are made and changed.
type Workload struct {
	Name string
	// Columns is the column list of CREATE TABLE; the first is id BIGINT
	// PRIMARY KEY.
	Columns string
	// Values is the SELECT list of an inserted row, over seq (its id).
	Values string
	// Set is the SET clause of an update.
	Set string
}

// Narrow is the 8-column table of the original stream benchmark.
var Narrow = Workload{
	Name:    "narrow",
	Columns: "id BIGINT PRIMARY KEY, a INT NOT NULL, b VARCHAR(32), c DECIMAL(12,2), d DATETIME(3), e DOUBLE, f TEXT, g TINYINT UNSIGNED",
	Values: "seq, seq % 1000, CONCAT('name-', seq), seq / 100, '2024-05-06 07:08:09.123' + INTERVAL seq SECOND, " +
		"seq * 1.5, REPEAT('x', 40), seq % 256",
	Set: "a = a + 1, e = e * 1.01",
}

// Realistic is issue 19's table: a bigint key, varchar, int, decimal(12,2),
// datetime(6), json, blob and double columns.
var Realistic = Workload{
	Name: "realistic",
	Columns: "id BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL, qty INT NOT NULL, price DECIMAL(12,2) NOT NULL, " +
		"at DATETIME(6) NOT NULL, doc JSON, data BLOB, score DOUBLE",
	Values: "seq, CONCAT('customer-', seq, '@example.com'), seq % 1000, seq / 100, " +
		"'2024-05-06 07:08:09.123456' + INTERVAL seq SECOND, " +
		"JSON_OBJECT('sku', CONCAT('SKU-', seq % 5000), 'tags', JSON_ARRAY('a', 'b', seq % 7), 'dims', JSON_OBJECT('w', seq % 90, 'h', 1.5)), " +
		"CONCAT(UNHEX(SHA2(seq, 256)), UNHEX(SHA2(seq + 1, 256))), seq * 1.25",
	Set: "qty = qty + 1, score = score * 1.01, at = at + INTERVAL 1 SECOND",
}

// JSONHeavy carries three JSON documents of a few hundred bytes a row.
var JSONHeavy = Workload{
	Name:    "json",
	Columns: "id BIGINT PRIMARY KEY, a JSON, b JSON, c JSON",
	Values: "seq, " + jsonDoc("seq") + ", " + jsonDoc("seq + 1") + ", " +
		"JSON_ARRAY(seq, seq * 2, CONCAT('item-', seq), JSON_OBJECT('n', seq, 'ok', TRUE), NULL, 3.25)",
	Set: "c = JSON_ARRAY(id, CONCAT('updated-', id))",
}

func jsonDoc(seq string) string {
	return "JSON_OBJECT('id', " + seq + ", 'name', CONCAT('user-', " + seq + "), 'email', CONCAT('u', " + seq + ", '@example.com'), " +
		"'address', JSON_OBJECT('street', CONCAT(" + seq + ", ' Main Street'), 'city', 'Springfield', 'zip', LPAD(" + seq + " % 100000, 5, '0')), " +
		"'roles', JSON_ARRAY('reader', 'writer'), 'score', " + seq + " * 0.5, 'active', " + seq + " % 2 = 0)"
}

// Wide40 has 40 columns: a key and 13 each of int, varchar and decimal.
var Wide40 = func() Workload {
	cols := []string{"id BIGINT PRIMARY KEY"}
	vals := []string{"seq"}
	for i := range 13 {
		cols = append(cols, fmt.Sprintf("i%d INT NOT NULL", i), fmt.Sprintf("s%d VARCHAR(32) NOT NULL", i), fmt.Sprintf("d%d DECIMAL(10,2) NOT NULL", i))
		vals = append(vals, fmt.Sprintf("seq %% %d", 100+i), fmt.Sprintf("CONCAT('v%d-', seq)", i), fmt.Sprintf("seq / %d", i+1))
	}
	return Workload{Name: "wide40", Columns: strings.Join(cols, ", "), Values: strings.Join(vals, ", "), Set: "i0 = i0 + 1, s5 = CONCAT('u-', id)"}
}()

// Load creates table db.t for w and commits changes row changes into it:
// 60 % inserts, 25 % updates, 15 % deletes (issue 19's 120k/50k/30k of
// 200k), 10 rows a statement and 10 statements a transaction. It returns
// the number of changes, which is changes rounded down to whole statements.
func Load(tb testing.TB, srv *mysqltest.Server, conn *sql.DB, db string, w Workload, changes int) int {
	tb.Helper()
	srv.Exec(tb, "CREATE TABLE `"+db+"`.t ("+w.Columns+")")
	const perStmt, perTx = 10, 10
	inserts := changes * 60 / 100 / perStmt * perStmt
	updates := changes * 25 / 100 / perStmt * perStmt
	deletes := changes * 15 / 100 / perStmt * perStmt
	var stmts []string
	for lo := 0; lo < inserts; lo += perStmt {
		stmts = append(stmts, fmt.Sprintf("INSERT INTO `%s`.t SELECT %s FROM (SELECT seq + %d AS seq FROM %s) q",
			db, w.Values, lo, mysqltest.Seq(perStmt)))
	}
	for lo := 1; lo <= updates; lo += perStmt {
		stmts = append(stmts, fmt.Sprintf("UPDATE `%s`.t SET %s WHERE id BETWEEN %d AND %d", db, w.Set, lo, lo+perStmt-1))
	}
	// Deletes take the rows from the top, so none was updated twice and
	// each statement deletes perStmt rows.
	for hi := inserts; hi > inserts-deletes; hi -= perStmt {
		stmts = append(stmts, fmt.Sprintf("DELETE FROM `%s`.t WHERE id BETWEEN %d AND %d", db, hi-perStmt+1, hi))
	}
	start := time.Now()
	for i := 0; i < len(stmts); i += perTx {
		tx, err := conn.Begin()
		if err != nil {
			tb.Fatal(err)
		}
		for _, q := range stmts[i:min(i+perTx, len(stmts))] {
			res, err := tx.Exec(q)
			if err != nil {
				tb.Fatalf("%.120s: %v", q, err)
			}
			if n, _ := res.RowsAffected(); n != perStmt {
				tb.Fatalf("%.120s changed %d rows, want %d", q, n, perStmt)
			}
		}
		if err := tx.Commit(); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Logf("%s workload: %d inserts, %d updates, %d deletes in %s", w.Name, inserts, updates, deletes, time.Since(start).Round(time.Millisecond))
	return inserts + updates + deletes
}
