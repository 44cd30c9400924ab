package mysqltest

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"testing"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

// The helpers here hide the SQL that differs between MariaDB and MySQL, so
// a test reads the same on both flavours.

// Seq is a derived table of one column, seq, holding 1..n in ascending
// order, for INSERT … SELECT seq FROM Seq(n). MariaDB's seq_1_to_N tables
// exist only there; this cross join of digits works on both flavours and,
// unlike a real helper table, writes nothing to the binary log.
// The ORDER BY with a LIMIT cannot be dropped by the optimizer, so the
// materialised rows are inserted (and their changes read) in seq order.
func Seq(n int) string {
	if n < 1 {
		n = 1
	}
	digits := "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 " +
		"UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	var from, expr []string
	scale := 1
	for i := 0; scale < n || i == 0; i++ {
		from = append(from, fmt.Sprintf("%s d%d", digits, i))
		expr = append(expr, fmt.Sprintf("d%d.d*%d", i, scale))
		scale *= 10
	}
	return fmt.Sprintf("(SELECT %s + 1 AS seq FROM %s ORDER BY seq LIMIT %d) seq_t",
		strings.Join(expr, " + "), strings.Join(from, " CROSS JOIN "), n)
}

// GTIDExecuted is the set of GTIDs the server has written to its binary
// log, in the form cdcout's --from gtid: accepts: MariaDB's
// @@gtid_binlog_pos or MySQL's @@gtid_executed. It is "" before the first
// transaction.
func (s *Server) GTIDExecuted(tb testing.TB) string {
	tb.Helper()
	db, err := sql.Open("mysql", s.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	return GTIDPos(tb, db)
}

// GTIDPos is GTIDExecuted over a connection pool of the caller's, of
// either flavour.
func GTIDPos(tb testing.TB, db *sql.DB) string {
	tb.Helper()
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		tb.Fatal(err)
	}
	q := "SELECT @@GLOBAL.gtid_executed"
	if strings.Contains(strings.ToLower(version), "mariadb") {
		q = "SELECT @@GLOBAL.gtid_binlog_pos"
	}
	var g string
	if err := db.QueryRow(q).Scan(&g); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
	return strings.ReplaceAll(g, "\n", "")
}

// LastGTID is the GTID of the last transaction conn committed. MariaDB
// tracks it per session (@@last_gtid); on MySQL it is the highest GTID of
// this server's own source id in gtid_executed, so call it only where no
// other session commits in between.
func (s *Server) LastGTID(tb testing.TB, conn *sql.Conn) string {
	tb.Helper()
	ctx := context.Background()
	if s.Flavor != MySQL {
		var g string
		if err := conn.QueryRowContext(ctx, "SELECT @@last_gtid").Scan(&g); err != nil {
			tb.Fatal(err)
		}
		return g
	}
	var uuid, set string
	if err := conn.QueryRowContext(ctx, "SELECT @@server_uuid, @@GLOBAL.gtid_executed").Scan(&uuid, &set); err != nil {
		tb.Fatal(err)
	}
	for _, part := range strings.Split(strings.ReplaceAll(set, "\n", ""), ",") {
		fields := strings.Split(strings.TrimSpace(part), ":")
		if len(fields) < 2 || fields[0] != uuid {
			continue
		}
		// uuid:1-5:7-9 (untagged intervals follow the uuid directly).
		last := fields[len(fields)-1]
		if i := strings.LastIndexByte(last, '-'); i >= 0 {
			last = last[i+1:]
		}
		if _, err := strconv.ParseUint(last, 10, 64); err != nil {
			tb.Fatalf("gtid_executed %q: interval %q", set, last)
		}
		return uuid + ":" + last
	}
	tb.Fatalf("gtid_executed %q holds nothing of this server (%s)", set, uuid)
	return ""
}

// QueryStrings runs a query (SHOW statements above all, whose columns
// differ by flavour and version) and returns every row's columns as text
// (NULL as ""), failing the test on error.
func QueryStrings(tb testing.TB, db *sql.DB, q string) [][]string {
	tb.Helper()
	rows, err := db.Query(q)
	if err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		tb.Fatal(err)
	}
	vals := make([]sql.RawBytes, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	var out [][]string
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = string(v)
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
	return out
}

// firstAccepted is the first of the statements (a newer name, then an
// older one) the server accepts; the last when none is.
func firstAccepted(db *sql.DB, qs ...string) string {
	for _, q := range qs[:len(qs)-1] {
		if rows, err := db.Query(q); err == nil {
			rows.Close()
			return q
		}
	}
	return qs[len(qs)-1]
}

// BinlogStatus is the current binary log file and position (SHOW MASTER
// STATUS, renamed SHOW BINARY LOG STATUS in MySQL 8.2 and removed in 8.4).
func (s *Server) BinlogStatus(tb testing.TB) (string, uint32) {
	tb.Helper()
	db := s.Open(tb)
	q := firstAccepted(db, "SHOW BINARY LOG STATUS", "SHOW MASTER STATUS")
	rows := QueryStrings(tb, db, q)
	if len(rows) == 0 {
		tb.Fatalf("%s returned no row", q)
	}
	pos, err := strconv.ParseUint(rows[0][1], 10, 32)
	if err != nil {
		tb.Fatalf("%s position %q: %v", q, rows[0][1], err)
	}
	return rows[0][0], uint32(pos)
}

// ReplicaServerIDs are the server ids of the binlog readers connected to
// the server (SHOW REPLICAS on MySQL 8.0.22+, SHOW SLAVE HOSTS elsewhere).
func (s *Server) ReplicaServerIDs(tb testing.TB) []uint32 {
	tb.Helper()
	db := s.Open(tb)
	q := firstAccepted(db, "SHOW REPLICAS", "SHOW SLAVE HOSTS")
	var ids []uint32
	for _, row := range QueryStrings(tb, db, q) {
		id, err := strconv.ParseUint(row[0], 10, 32)
		if err != nil {
			tb.Fatalf("%s: server id %q: %v", q, row[0], err)
		}
		ids = append(ids, uint32(id))
	}
	return ids
}

// GTIDSetContains reports whether the GTID set holds gtid, for either
// flavour's notation (MariaDB domain-server-seq, MySQL uuid[:tag]:n).
func GTIDSetContains(flavor Flavor, set, gtid string) (bool, error) {
	s, err := gomysql.ParseGTIDSet(string(flavor), set)
	if err != nil {
		return false, fmt.Errorf("GTID set %q: %w", set, err)
	}
	g, err := gomysql.ParseGTIDSet(string(flavor), gtid)
	if err != nil {
		return false, fmt.Errorf("GTID %q: %w", gtid, err)
	}
	return s.Contain(g), nil
}

// BinlogBytes is the size of every binary log file the server keeps, for
// benchmarks that report how much binlog a workload and cdcout's own state
// writes cost.
func (s *Server) BinlogBytes(tb testing.TB) int64 {
	tb.Helper()
	var total int64
	for _, r := range QueryStrings(tb, s.Open(tb), "SHOW BINARY LOGS") {
		n, err := strconv.ParseInt(r[1], 10, 64)
		if err != nil {
			tb.Fatalf("SHOW BINARY LOGS size %q: %v", r[1], err)
		}
		total += n
	}
	return total
}
