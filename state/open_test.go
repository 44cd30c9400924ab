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
