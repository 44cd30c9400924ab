package binlog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

func openErr(t *testing.T, cfg Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, cfg)
	if err == nil {
		s.Close()
		t.Fatal("Open succeeded, want an error")
	}
	return err
}

func wantNotReady(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if !errors.Is(err, ErrServerNotReady) {
		t.Errorf("error %v is not ErrServerNotReady", err)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not mention %q", err, f)
		}
	}
}

func TestCheckBinlogOff(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{Args: []string{"--skip-log-bin"}})
	err := openErr(t, testConfig(t, srv))
	wantNotReady(t, err, "binary log is off", "--log-bin", "--binlog-format=ROW", "--server-id")
}

func TestCheckFormatAndRowImage(t *testing.T) {
	srv := mysqltest.Shared(t)
	t.Cleanup(func() {
		srv.Exec(t, "SET GLOBAL binlog_format = 'ROW'", "SET GLOBAL binlog_row_image = 'FULL'")
	})
	srv.Exec(t, "SET GLOBAL binlog_format = 'STATEMENT'")
	wantNotReady(t, openErr(t, testConfig(t, srv)), "binlog_format is STATEMENT", "SET GLOBAL binlog_format = 'ROW'")
	srv.Exec(t, "SET GLOBAL binlog_format = 'ROW'", "SET GLOBAL binlog_row_image = 'MINIMAL'")
	wantNotReady(t, openErr(t, testConfig(t, srv)), "binlog_row_image is MINIMAL", "FULL")
}

func TestCheckGrants(t *testing.T) {
	srv := mysqltest.Shared(t)
	user := fmt.Sprintf("ro_%d", nextServerID())
	const password = "s3cret-pw-never-shown"
	// REPLICATION SLAVE ADMIN (MariaDB) and REPLICATION_SLAVE_ADMIN (MySQL)
	// are not REPLICATION SLAVE.
	decoy := "REPLICATION SLAVE ADMIN"
	if srv.Flavor == mysqltest.MySQL {
		decoy = "REPLICATION_SLAVE_ADMIN"
	}
	srv.Exec(t,
		"CREATE USER '"+user+"'@'%' IDENTIFIED BY '"+password+"'",
		"GRANT SELECT, "+decoy+" ON *.* TO '"+user+"'@'%'",
	)
	t.Cleanup(func() { srv.Exec(t, "DROP USER '"+user+"'@'%'") })
	dsn, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	dsn.User, dsn.Passwd = user, password
	cfg := testConfig(t, srv)
	cfg.DSN = dsn.FormatDSN()
	err = openErr(t, cfg)
	wantNotReady(t, err, "lacks REPLICATION SLAVE and REPLICATION CLIENT", "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+user+"'@'%'")
	if strings.Contains(err.Error(), password) {
		t.Fatalf("error shows the password: %v", err)
	}

	// A wrong password: the connection error names the account, never the
	// password.
	dsn.Passwd = "wrong-" + password
	cfg.DSN = dsn.FormatDSN()
	err = openErr(t, cfg)
	if strings.Contains(err.Error(), password) || !strings.Contains(err.Error(), user+"@") {
		t.Fatalf("error %q: want the account and no password", err)
	}

	// With the grants it opens.
	srv.Exec(t, "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+user+"'@'%'")
	dsn.Passwd = password
	cfg.DSN = dsn.FormatDSN()
	openStream(t, cfg)
}

func TestCheckServerID(t *testing.T) {
	srv := mysqltest.Shared(t)
	cfg := testConfig(t, srv)
	cfg.ServerID = 0
	wantNotReady(t, openErr(t, cfg), "server id 0")
	cfg.ServerID = 1 // the throwaway server's own
	wantNotReady(t, openErr(t, cfg), "server's own server_id")

	// A connected replica holds an id: a second reader with it is refused.
	cfg.ServerID = nextServerID()
	first := openStream(t, cfg)
	collect(t, first)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		for _, id := range srv.ReplicaServerIDs(t) {
			if id == cfg.ServerID {
				n++
			}
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first reader never registered as a replica")
		}
		time.Sleep(50 * time.Millisecond)
	}
	err := openErr(t, cfg)
	wantNotReady(t, err, fmt.Sprintf("server id %d is already used by a connected replica", cfg.ServerID))
	if !errors.Is(err, ErrServerIDInUse) {
		t.Fatalf("error %v does not match ErrServerIDInUse", err)
	}
}

// TestLeastPrivilegeUserMariaDB: the README's least-privilege grants for
// MariaDB let every start-up check run, the server id collision check
// included (SHOW SLAVE HOSTS needs REPLICATION MASTER ADMIN since 10.5.2).
// MariaDB-only: the grants are MariaDB's; keep them in step with README.md.
func TestLeastPrivilegeUserMariaDB(t *testing.T) {
	srv := mysqltest.Shared(t)
	mysqltest.OnlyFlavor(t, srv, mysqltest.MariaDB, "the grant is MariaDB's; engine.TestLeastPrivilegeUser runs the README's grants on both")
	user := fmt.Sprintf("lp_%d", nextServerID())
	srv.Exec(t,
		"CREATE USER '"+user+"'@'%' IDENTIFIED BY 'lp-pw'",
		"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+user+"'@'%'",
		"GRANT SELECT ON *.* TO '"+user+"'@'%'",
		"GRANT REPLICATION MASTER ADMIN ON *.* TO '"+user+"'@'%'",
		"GRANT ALL PRIVILEGES ON cdcout.* TO '"+user+"'@'%'",
	)
	t.Cleanup(func() { srv.Exec(t, "DROP USER '"+user+"'@'%'") })
	dsn, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	dsn.User, dsn.Passwd = user, "lp-pw"

	first := testConfig(t, srv)
	collect(t, openStream(t, first))
	cfg := testConfig(t, srv)
	cfg.DSN, cfg.ServerID = dsn.FormatDSN(), first.ServerID
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Until the first reader has registered, Open succeeds.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := Open(ctx, cfg)
		cancel()
		if err == nil {
			s.Close()
		} else if errors.Is(err, ErrServerIDInUse) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the least-privilege user's reader did not see the colliding replica: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
