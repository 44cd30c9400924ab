package state

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"
	_ "unsafe" // go:linkname

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestErrorClassesFromRealServers builds each error the classifiers see
// from a real server (or a real dial) and checks the class: a lost
// connection is retried, a refusal is not, and a statement the server
// rejects is neither.
func TestErrorClassesFromRealServers(t *testing.T) {
	srv := mysqltest.Shared(t)
	ctx := context.Background()
	cfg, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	open := func(t *testing.T, c *mysql.Config) *sql.DB {
		t.Helper()
		db, err := sql.Open("mysql", c.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	ping := func(c *mysql.Config) error {
		db, err := sql.Open("mysql", c.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		return db.PingContext(ctx)
	}

	cases := []struct {
		name           string
		err            func(t *testing.T) error
		lost, refused  bool
		wantErrno      uint16 // 0: any
		mysqlErrnoOnly bool   // wantErrno only on Oracle MySQL
	}{
		{name: "wrong password", refused: true, wantErrno: ErrnoAccessDenied, err: func(t *testing.T) error {
			c := cfg.Clone()
			c.Passwd = "not-the-password"
			return ping(c)
		}},
		{name: "unknown database", refused: true, wantErrno: ErrnoBadDB, err: func(t *testing.T) error {
			c := cfg.Clone()
			c.DBName = "cdcout_no_such_database"
			return ping(c)
		}},
		{name: "nothing listens", lost: true, err: func(t *testing.T) error {
			c := cfg.Clone()
			c.Net, c.Addr, c.Timeout = "tcp", mysqltest.FreeAddr(t), 2*time.Second
			return ping(c)
		}},
		{name: "syntax error", wantErrno: 1064, err: func(t *testing.T) error {
			_, err := open(t, cfg).ExecContext(ctx, "SELEC 1")
			return err
		}},
		{name: "session killed", lost: true, err: func(t *testing.T) error {
			db := open(t, cfg)
			conn, id := session(t, db)
			if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL %d", id)); err != nil {
				t.Fatal(err)
			}
			_, err = conn.ExecContext(ctx, "SELECT 1")
			return err
		}},
		{name: "session killed mid-statement", lost: true, err: func(t *testing.T) error {
			db := open(t, cfg)
			conn, id := session(t, db)
			done := make(chan error, 1)
			go func() {
				_, err := conn.ExecContext(ctx, "SELECT SLEEP(30)")
				done <- err
			}()
			deadline := time.Now().Add(10 * time.Second)
			for {
				var n int
				if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO LIKE 'SELECT SLEEP%'", id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the statement never started")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL %d", id)); err != nil {
				t.Fatal(err)
			}
			return <-done
		}},
		{name: "idle past wait_timeout", lost: true, wantErrno: ErrnoClientInteractionTimeout, mysqlErrnoOnly: true, err: func(t *testing.T) error {
			conn, _ := session(t, open(t, cfg))
			if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = 1"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2500 * time.Millisecond) // the server's idle limit is what is tested
			_, err = conn.ExecContext(ctx, "SELECT 1")
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err(t)
			if err == nil {
				t.Fatal("no error")
			}
			t.Logf("%s: %v (errno %d)", srv.Flavor, err, Errno(err))
			if got := ConnectionLost(err); got != tc.lost {
				t.Errorf("ConnectionLost(%v) = %v, want %v", err, got, tc.lost)
			}
			if got := Refused(err); got != tc.refused {
				t.Errorf("Refused(%v) = %v, want %v", err, got, tc.refused)
			}
			if tc.wantErrno != 0 && (!tc.mysqlErrnoOnly || srv.Flavor == mysqltest.MySQL) {
				if got := Errno(err); got != tc.wantErrno {
					t.Errorf("Errno(%v) = %d, want %d", err, got, tc.wantErrno)
				}
			}
			// Wrapping keeps the class: the callers see wrapped errors.
			if got := ConnectionLost(fmt.Errorf("read checkpoint: %w", err)); got != tc.lost {
				t.Errorf("wrapped: ConnectionLost = %v, want %v", got, tc.lost)
			}
		})
	}
}

// session pins one connection of db, closed when the test ends, and
// returns it with its server connection id.
func session(t *testing.T, db *sql.DB) (*sql.Conn, int64) {
	t.Helper()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var id int64
	if err := conn.QueryRowContext(context.Background(), "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return conn, id
}

// TestConnectionLostIgnoresText: an error that only says "connection
// reset" or "EOF" in its text is not classified as a lost connection;
// only its type or server error number counts.
func TestConnectionLostIgnoresText(t *testing.T) {
	for _, msg := range []string{"connection reset by peer", "unexpected EOF", "invalid connection", "server shutdown"} {
		if ConnectionLost(errors.New(msg)) {
			t.Errorf("ConnectionLost(errors.New(%q)) = true, want false", msg)
		}
	}
	if ConnectionLost(nil) {
		t.Error("ConnectionLost(nil) = true")
	}
}

// driverErrBadConnNoWrite is go-sql-driver's own unexported sentinel.
//
//go:linkname driverErrBadConnNoWrite github.com/go-sql-driver/mysql.errBadConnNoWrite
var driverErrBadConnNoWrite error

// TestDriverNoWriteIsLost: the driver's errBadConnNoWrite, which some of
// its paths return without mapping it to driver.ErrBadConn, is a lost
// connection, wrapped or not; the same text in another type is not.
func TestDriverNoWriteIsLost(t *testing.T) {
	if driverErrBadConnNoWrite == nil {
		t.Fatal("go-sql-driver's errBadConnNoWrite is not linked")
	}
	for _, err := range []error{driverErrBadConnNoWrite, fmt.Errorf("read backfill fences: %w", driverErrBadConnNoWrite)} {
		if !ConnectionLost(err) {
			t.Errorf("ConnectionLost(%v) = false, want true", err)
		}
	}
	if ConnectionLost(textError("bad connection")) {
		t.Error(`ConnectionLost(textError("bad connection")) = true: only the driver's sentinel type counts`)
	}
}

type textError string

func (e textError) Error() string { return string(e) }
