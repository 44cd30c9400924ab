package state

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

func TestOpenSessionSettings(t *testing.T) {
	s := mysqltest.Shared(t)
	user := "st_open_user"
	s.Exec(t,
		"CREATE USER IF NOT EXISTS '"+user+"'@'%' IDENTIFIED BY 'pw'",
		"GRANT SELECT ON *.* TO '"+user+"'@'%'")

	for _, tc := range []struct {
		name        string
		dsn         string
		wantMinimal bool
	}{
		{"privileged", s.DSN, true},
		{"unprivileged", fmt.Sprintf("%s:pw@tcp(127.0.0.1:%d)/", user, s.Port), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Open(tc.dsn, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var tz, image string
			if err := p.QueryRow("SELECT @@session.time_zone, @@session.binlog_row_image").Scan(&tz, &image); err != nil {
				t.Fatal(err)
			}
			if tz != "+00:00" {
				t.Errorf("session time_zone = %q, want +00:00", tz)
			}
			if got := p.MinimalRowImage(); got != tc.wantMinimal {
				t.Errorf("MinimalRowImage() = %v, want %v", got, tc.wantMinimal)
			}
			if want := map[bool]string{true: "MINIMAL", false: "FULL"}[tc.wantMinimal]; image != want {
				t.Errorf("session binlog_row_image = %q, want %q", image, want)
			}
			if s.Flavor == mysqltest.MariaDB {
				// The statement text of a state write (a segment's
				// payload literal) is not logged beside its rows.
				var annotate int
				if err := p.QueryRow("SELECT @@session.binlog_annotate_row_events").Scan(&annotate); err != nil {
					t.Fatal(err)
				}
				if got, want := annotate == 1, !tc.wantMinimal; got != want {
					t.Errorf("session binlog_annotate_row_events = %d, want on: %v", annotate, want)
				}
			}
		})
	}
}

// A connection that stops talking mid-transaction (a frozen replica) is
// closed by the server after the idle limit, and its locks go with it.
func TestOpenIdleLimitReleasesFrozenTransaction(t *testing.T) {
	s := mysqltest.Shared(t)
	schema := s.CreateDB(t, "st_idle")
	s.Exec(t, "CREATE TABLE `"+schema+"`.l (id INT PRIMARY KEY, v INT)", "INSERT INTO `"+schema+"`.l VALUES (1, 0)")
	frozen, err := Open(s.DSN, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close()
	var wt int
	if err := frozen.QueryRow("SELECT @@session.wait_timeout").Scan(&wt); err != nil || wt != 2 {
		t.Fatalf("wait_timeout = %d (%v), want 2", wt, err)
	}
	tx, err := frozen.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRow("SELECT v FROM `" + schema + "`.l WHERE id = 1 LOCK IN SHARE MODE").Scan(&v); err != nil {
		t.Fatal(err)
	}
	// The "frozen" transaction now sends nothing; another session's write
	// must get through once the server drops it, well before
	// innodb_lock_wait_timeout (50 s).
	other := s.Open(t)
	start := time.Now()
	if _, err := other.Exec("UPDATE `" + schema + "`.l SET v = 1 WHERE id = 1"); err != nil {
		t.Fatalf("update behind a frozen transaction: %v", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("update waited %s behind the frozen transaction", d)
	}
}

// Statements with arguments reach the server as one query with the
// arguments in it, not as prepared statements (see Open), and binary
// arguments arrive intact.
func TestOpenInterpolatesArguments(t *testing.T) {
	s := mysqltest.Shared(t)
	conn := openConn(t, s.DSN)
	prepares := func() int {
		var name string
		var n int
		if err := conn.QueryRowContext(t.Context(), "SHOW SESSION STATUS LIKE 'Com_stmt_prepare'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := prepares()
	blob := []byte{0, '\'', '\\', '"', 0x1a, '\n', '\r', 0xff, 0xc3, 'x'}
	var got []byte
	var n int
	if err := conn.QueryRowContext(t.Context(), "SELECT ?, ?", blob, 42).Scan(&got, &n); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(blob) || n != 42 {
		t.Fatalf("arguments came back as %q, %d; want %q, 42", got, n, blob)
	}
	if d := prepares() - before; d != 0 {
		t.Fatalf("%d server-side prepares for a statement with arguments, want 0 (interpolated)", d)
	}
}

// The server reads a state connection's statements as binary (Open), yet
// its literals keep the connection's character set: UTF-8 text round-trips,
// comparisons keep their collation and their index, and every byte value
// of a payload survives. A DSN that names another charset keeps its own.
func TestOpenBinaryClientCharset(t *testing.T) {
	s := mysqltest.Shared(t)
	db := s.CreateDB(t, "st_cs")
	conn := openConn(t, s.DSN)
	var client, connection string
	if err := conn.QueryRowContext(t.Context(), "SELECT @@session.character_set_client, @@session.character_set_connection").Scan(&client, &connection); err != nil {
		t.Fatal(err)
	}
	if client != "binary" || connection != "utf8mb4" {
		t.Fatalf("character_set_client, character_set_connection = %s, %s; want binary, utf8mb4", client, connection)
	}
	tbl := Table(db, "cs")
	if _, err := conn.ExecContext(t.Context(), "CREATE TABLE "+tbl+
		" (k VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci PRIMARY KEY, v TEXT CHARACTER SET utf8mb4, b LONGBLOB)"); err != nil {
		t.Fatal(err)
	}
	blob := make([]byte, 256)
	for i := range blob {
		blob[i] = byte(i)
	}
	const key, text = "clé ✓", "ünïcödé \\ 'quoted' \"😀\""
	if _, err := conn.ExecContext(t.Context(), "INSERT INTO "+tbl+" (k, v, b) VALUES (?, ?, ?)", key, text, blob); err != nil {
		t.Fatal(err)
	}
	var v string
	var b []byte
	var chars int
	if err := conn.QueryRowContext(t.Context(), "SELECT v, b, CHAR_LENGTH(k) FROM "+tbl+" WHERE k = ?", "CLÉ ✓").Scan(&v, &b, &chars); err != nil {
		t.Fatalf("case-insensitive lookup of %q: %v", key, err)
	}
	if v != text || string(b) != string(blob) || chars != 5 {
		t.Fatalf("read back %q, %d bytes (equal: %v), CHAR_LENGTH %d; want %q, the 256 byte values, 5", v, len(b), string(b) == string(blob), chars, text)
	}
	var plan string
	if err := conn.QueryRowContext(t.Context(), "EXPLAIN FORMAT=JSON SELECT v FROM "+tbl+" WHERE k = ?", key).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	// MySQL 9's plan format reads a const row "before execution", which
	// only a unique key lookup does.
	if !strings.Contains(plan, `"key": "PRIMARY"`) && !strings.Contains(plan, `"rows_fetched_before_execution"`) {
		t.Fatalf("lookup by key does not use the primary key:\n%s", plan)
	}

	for _, param := range []string{"charset=latin1", "character_set_client=utf8mb4"} {
		other, err := Open(s.DSNWith(param), 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := other.QueryRow("SELECT @@session.character_set_client").Scan(&client); err != nil {
			t.Fatal(err)
		}
		other.Close()
		if client == "binary" {
			t.Errorf("DSN with %s: character_set_client = binary, want the DSN's own", param)
		}
	}
}

func TestBinaryClientSafe(t *testing.T) {
	for dsn, want := range map[string]bool{
		"root@tcp(127.0.0.1:3306)/":                               true,
		"root:p/w?x=1@tcp(127.0.0.1:3306)/cdcout":                 true,
		"root@tcp(127.0.0.1:3306)/?charset=utf8mb4,utf8":          true,
		"root@tcp(127.0.0.1:3306)/?charset=utf8mb4,latin1":        false,
		"root@tcp(127.0.0.1:3306)/?charset=gbk":                   false,
		"root@tcp(127.0.0.1:3306)/?collation=utf8mb4_bin":         true,
		"root@tcp(127.0.0.1:3306)/?collation=latin1_swedish_ci":   false,
		"root@tcp(127.0.0.1:3306)/?character_set_client=utf8mb4":  false,
		"root@tcp(127.0.0.1:3306)/db?tls=false&charset=utf8":      true,
		"root@tcp(127.0.0.1:3306)/db?parseTime=true&charset=big5": false,
	} {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		if got := binaryClientSafe(dsn, cfg); got != want {
			t.Errorf("binaryClientSafe(%s) = %v, want %v", dsn, got, want)
		}
	}
}

// openConn opens a state pool on dsn and one connection of it, both
// closed when the test ends.
func openConn(t *testing.T, dsn string) *sql.Conn {
	t.Helper()
	p, err := Open(dsn, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	conn, err := p.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A transaction begun without options on the ReadCommitted pool runs at
// READ COMMITTED (it sees a row another session commits between two of
// its reads); one on the main pool keeps the server's REPEATABLE READ (it
// does not see the row).
func TestOpenReadCommittedPool(t *testing.T) {
	s := mysqltest.Shared(t)
	s.Exec(t, "CREATE DATABASE IF NOT EXISTS st_rc", "CREATE TABLE IF NOT EXISTS st_rc.t (id INT PRIMARY KEY)", "DELETE FROM st_rc.t")
	p, err := Open(s.DSN, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	id := 0
	seesLaterCommit := func(db *sql.DB) bool {
		t.Helper()
		tx, err := db.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		var before, after int
		if err := tx.QueryRow("SELECT COUNT(*) FROM st_rc.t").Scan(&before); err != nil {
			t.Fatal(err)
		}
		id++
		s.Exec(t, fmt.Sprintf("INSERT INTO st_rc.t VALUES (%d)", id))
		if err := tx.QueryRow("SELECT COUNT(*) FROM st_rc.t").Scan(&after); err != nil {
			t.Fatal(err)
		}
		return after > before
	}
	if !seesLaterCommit(p.ReadCommitted()) {
		t.Fatal("a transaction of the ReadCommitted pool did not see a row committed during it: not READ COMMITTED")
	}
	if seesLaterCommit(p.DB) {
		t.Fatal("a transaction of the main pool saw a row committed during it: the main pool's isolation changed")
	}
}
