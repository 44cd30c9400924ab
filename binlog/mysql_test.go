package binlog

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// Tests of binary log features only Oracle MySQL has. They run when the
// suite runs on MySQL (CDCOUT_TEST_FLAVOR=mysql, as CI does).

// binlogEventTypes counts the event types SHOW BINLOG EVENTS lists.
func binlogEventTypes(t *testing.T, srv *mysqltest.Server) map[string]int {
	t.Helper()
	types := map[string]int{}
	for _, row := range mysqltest.QueryStrings(t, srv.Open(t), "SHOW BINLOG EVENTS") {
		types[row[2]]++
	}
	return types
}

// TestTransactionCompressionMySQL: with binlog_transaction_compression=ON
// MySQL writes each transaction as one zstd-compressed
// TRANSACTION_PAYLOAD_EVENT; a large one's rows come out complete, in
// order, with their ordinals, and the commit after them.
func TestTransactionCompressionMySQL(t *testing.T) {
	mysqltest.OnlyFlavor(t, mysqltest.Shared(t), mysqltest.MySQL, "MariaDB's counterpart is TestCompressedBinlogMariaDB")
	srv := mysqltest.Start(t, mysqltest.Options{Args: []string{"--binlog-transaction-compression=ON"}})
	db := srv.CreateDB(t, "zstd")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, body VARCHAR(200))")
	s := openStream(t, testConfig(t, srv, db))
	c := collect(t, s)
	const n = 20000
	srv.Exec(t,
		"INSERT INTO `"+db+"`.t SELECT seq, CONCAT(REPEAT('compressible ', 10), seq) FROM "+mysqltest.Seq(n),
		"UPDATE `"+db+"`.t SET body = 'short' WHERE id = 7",
		"DELETE FROM `"+db+"`.t WHERE id = 8",
	)
	evs := c.waitChanges(t, n+2)
	changes := changesOf(evs)
	for i, ch := range changes[:n] {
		if ch.Op != "c" || ch.Source.Row != i || ch.After["id"] != int64(i+1) {
			t.Fatalf("change %d: %s row %d after %v", i, ch.Op, ch.Source.Row, ch.After)
		}
	}
	got := describe(t, evs)[n:]
	long := strings.Repeat("compressible ", 10)
	checkLines(t, got, []string{
		`u t {"body":"` + long + `7","id":7} {"body":"short","id":7}`,
		`d t {"body":"` + long + `8","id":8} null`,
	})
	commits := 0
	for _, ev := range evs {
		if ev.Commit != nil && ev.Commit.Rows > 0 {
			commits++
			if ev.Commit.Pos.GTIDSet == "" || ev.Commit.GTID == "" {
				t.Errorf("commit without GTID: %+v", ev.Commit)
			}
		}
	}
	if commits != 3 {
		t.Errorf("%d commits with rows, want 3", commits)
	}
	if types := binlogEventTypes(t, srv); types["Transaction_payload"] < 3 {
		t.Fatalf("binlog events %v: the server did not compress", types)
	}
}

// TestTaggedGTIDResumeMySQL: MySQL 8.3+ tagged GTIDs (uuid:tag:N, from SET
// gtid_next = 'AUTOMATIC:tag') key changes and resume a stream like plain
// ones.
func TestTaggedGTIDResumeMySQL(t *testing.T) {
	srv := mysqltest.Shared(t)
	mysqltest.OnlyFlavor(t, srv, mysqltest.MySQL, "MariaDB has no tagged GTIDs")
	db := srv.CreateDB(t, "tagged")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY)")
	conn, err := srv.Open(t).Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{"SET gtid_next = 'AUTOMATIC:cdcout'", "INSERT INTO `" + db + "`.t VALUES (1)", "INSERT INTO `" + db + "`.t VALUES (2)"} {
		if _, err := conn.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg := testConfig(t, srv, db)
	cfg.From = "start"
	c := collect(t, openStream(t, cfg))
	evs := c.waitChanges(t, 2)
	var first *Commit
	for _, ev := range evs {
		if ev.Commit != nil && ev.Commit.Rows > 0 {
			first = ev.Commit
			break
		}
	}
	ch := changesOf(evs)[0]
	if !strings.Contains(ch.Source.GTID, ":cdcout:") || first == nil || first.GTID != ch.Source.GTID {
		t.Fatalf("change gtid %q, commit %+v: want a tagged GTID", ch.Source.GTID, first)
	}
	if !strings.Contains(first.Pos.GTIDSet, ":cdcout:") {
		t.Fatalf("commit position %q does not hold the tag", first.Pos.GTIDSet)
	}
	// Resume from the first commit: only the second row comes again.
	cfg = testConfig(t, srv, db)
	cfg.Resume = &first.Pos
	c = collect(t, openStream(t, cfg))
	if _, err := conn.ExecContext(t.Context(), "INSERT INTO `"+db+"`.t VALUES (3)"); err != nil {
		t.Fatal(err)
	}
	got := describe(t, c.waitChanges(t, 2))
	checkLines(t, got, []string{`c t null {"id":2}`, `c t null {"id":3}`})
}

// TestPartialJSONUpdatesMySQL: with binlog_row_value_options=PARTIAL_JSON
// MySQL logs updates as PARTIAL_UPDATE_ROWS_EVENTs whose after images may
// hold only the changes to a JSON document. Every update comes out with
// its full after image — the diffs applied to the before image — equal to
// what the server returns for the row, also when no JSON column changed,
// and the row ordinals stay exact.
func TestPartialJSONUpdatesMySQL(t *testing.T) {
	mysqltest.OnlyFlavor(t, mysqltest.Shared(t), mysqltest.MySQL, "PARTIAL_JSON is MySQL's; MariaDB's JSON is LONGTEXT")
	srv := mysqltest.Start(t, mysqltest.Options{Args: []string{"--binlog-row-value-options=PARTIAL_JSON"}})
	db := srv.CreateDB(t, "pjson")
	tbl := "`" + db + "`.t"
	srv.Exec(t, "CREATE TABLE "+tbl+" (id INT PRIMARY KEY, j JSON, v INT, k JSON)")
	doc := `'{"a": 1, "b": {"c": [1, 2, 3], "d": "x"}, "long": "` + strings.Repeat("y", 200) + `", "n": null, "q k": 5}'`
	var inserts []string
	for id := 1; id <= 12; id++ {
		inserts = append(inserts, fmt.Sprintf("INSERT INTO %s VALUES (%d, %s, %d, '[10, 20, {\"z\": 1.5}]')", tbl, id, doc, id))
	}
	srv.Exec(t, inserts...)
	s := openStream(t, testConfig(t, srv, db))
	c := collect(t, s)
	updates := []string{
		"UPDATE " + tbl + " SET j = JSON_SET(j, '$.a', 2) WHERE id = 1",
		"UPDATE " + tbl + " SET j = JSON_SET(j, '$.a', 3, '$.b.d', 'yy', '$.new', JSON_OBJECT('deep', JSON_ARRAY(1, 2.5))) WHERE id = 2",
		"UPDATE " + tbl + " SET j = JSON_REPLACE(j, '$.b.c[1]', 'two', '$.missing', 0) WHERE id = 3",
		"UPDATE " + tbl + " SET j = JSON_REMOVE(j, '$.b.c[0]', '$.n') WHERE id = 4",
		"UPDATE " + tbl + " SET j = JSON_SET(j, '$.\"q k\"', CAST('2024-02-29' AS DATE), '$.dec', CAST(12.345 AS DECIMAL(10,3))) WHERE id = 5",
		"UPDATE " + tbl + " SET j = JSON_ARRAY_INSERT(j, '$.b.c[1]', 1.5e300) WHERE id = 6",
		"UPDATE " + tbl + " SET v = 600 WHERE id = 7", // no JSON column changed
		"UPDATE " + tbl + " SET j = JSON_SET(j, '$.a', 8), k = JSON_REMOVE(k, '$[2].z'), v = 800 WHERE id = 8",
		"UPDATE " + tbl + " SET j = JSON_SET(j, '$.b.c', JSON_ARRAY()) WHERE id = 9",
		"UPDATE " + tbl + " SET j = '{\"whole\": \"new\"}' WHERE id = 10",
		"UPDATE " + tbl + " SET k = JSON_SET(k, '$[0]', -0.001, '$[5]', 'appended') WHERE id = 11",
		"DELETE FROM " + tbl + " WHERE id = 12",
	}
	srv.Exec(t, append(append([]string{"BEGIN"}, updates...), "COMMIT")...)
	changes := changesOf(c.waitChanges(t, len(updates)))
	if types := binlogEventTypes(t, srv); types["Update_rows_partial"] == 0 {
		t.Fatalf("binlog events %v: the server wrote no partial updates", types)
	}
	server := map[int64][2]string{}
	rows, err := srv.Open(t).Query("SELECT id, CAST(j AS CHAR), CAST(k AS CHAR) FROM " + tbl)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		var j, k string
		if err := rows.Scan(&id, &j, &k); err != nil {
			t.Fatal(err)
		}
		server[id] = [2]string{canonicalJSON(t, j), canonicalJSON(t, k)}
	}
	rows.Close()
	for i, ch := range changes {
		if ch.Source.Row != i {
			t.Errorf("change %d has row ordinal %d", i, ch.Source.Row)
		}
		if ch.Op == "d" {
			if i != len(updates)-1 || ch.Before["id"] != int64(12) {
				t.Errorf("change %d: delete of %v", i, ch.Before)
			}
			continue
		}
		id := ch.After["id"].(int64)
		got := [2]string{valueJSON(t, ch.After["j"]), valueJSON(t, ch.After["k"])}
		if ch.Op != "u" || got != server[id] {
			t.Errorf("%s: %s after image\n j %s\n k %s\nserver\n j %s\n k %s", updates[i], ch.Op, got[0], got[1], server[id][0], server[id][1])
		}
		if want := valueJSON(t, ch.Before["k"]); id != 8 && id != 11 && got[1] != want {
			t.Errorf("%s: k changed from %s to %s", updates[i], want, got[1])
		}
	}
	if len(changes) != len(updates) {
		t.Fatalf("%d changes for %d statements", len(changes), len(updates))
	}
}

// canonicalJSON is the canonical encoding of a JSON text.
func canonicalJSON(t *testing.T, s string) string {
	t.Helper()
	b, err := canonical.Marshal(canonical.RawJSON(s))
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return string(b)
}

// valueJSON is the canonical encoding of one decoded value.
func valueJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := canonical.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %v: %v", v, err)
	}
	return string(b)
}

// TestCachingSHA2LoginMySQL: MySQL 8's default authentication,
// caching_sha2_password, for a user whose password is not cached yet
// needs the full exchange: over plain TCP the password goes RSA-encrypted
// with the server's public key, over TLS in the clear inside the tunnel.
// Both the SQL connection and the binlog connection must get through it.
func TestCachingSHA2LoginMySQL(t *testing.T) {
	srv := mysqltest.Shared(t)
	mysqltest.OnlyFlavor(t, srv, mysqltest.MySQL, "caching_sha2_password is MySQL's")
	db := srv.CreateDB(t, "sha2")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY)")
	user := fmt.Sprintf("sha2_%d", nextServerID())
	const password = "sha2-Secret-pw"
	srv.Exec(t, "CREATE USER '"+user+"'@'%' IDENTIFIED WITH caching_sha2_password BY '"+password+"'",
		"GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO '"+user+"'@'%'")
	t.Cleanup(func() { srv.Exec(t, "DROP USER '"+user+"'@'%'") })
	for i, c := range []struct{ name, params string }{{"tcp-rsa", ""}, {"tls", "tls=skip-verify"}} {
		params := c.params
		t.Run(c.name, func(t *testing.T) {
			// An empty cache: the login takes the full exchange.
			srv.Exec(t, "FLUSH PRIVILEGES")
			cfg := testConfig(t, srv, db)
			cfg.DSN = fmt.Sprintf("%s:%s@tcp(127.0.0.1:%d)/?%s", user, password, srv.Port, params)
			c := collect(t, openStream(t, cfg))
			srv.Exec(t, fmt.Sprintf("INSERT INTO `%s`.t VALUES (%d)", db, i))
			checkLines(t, describe(t, c.waitChanges(t, 1)), []string{fmt.Sprintf(`c t null {"id":%d}`, i)})
			// The DSN's transport is what the test says it is.
			conn, err := sql.Open("mysql", cfg.DSN)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			var variable, cipher string
			if err := conn.QueryRow("SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&variable, &cipher); err != nil {
				t.Fatal(err)
			}
			if (cipher != "") != (params != "") {
				t.Fatalf("Ssl_cipher %q with DSN parameters %q", cipher, params)
			}
		})
	}
}
