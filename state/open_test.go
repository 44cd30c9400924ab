package state

import (
	"fmt"
	"testing"
	"time"

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
	p, err := Open(s.DSN, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	conn, err := p.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
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
