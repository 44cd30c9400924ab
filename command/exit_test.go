package command

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestExitCodesAgree: one cause, one exit code and one hint, whichever
// command meets it. A wrong password exits 2 with the hint to check the
// DSN from run, tail, status and dead list alike; run does not promise to
// keep trying a source it will not retry.
func TestExitCodesAgree(t *testing.T) {
	srv := mysqltest.Shared(t)
	mc, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	srv.Exec(t, "CREATE USER IF NOT EXISTS 'cdcexit'@'%' IDENTIFIED BY 'right'")
	wrong := mc.Clone()
	wrong.User, wrong.Passwd = "cdcexit", "wrong"
	dsn := wrong.FormatDSN()
	for _, args := range [][]string{
		{"run", "--dsn", dsn, "--sink", "stdout:", "--http-addr", "off"},
		{"tail", "--dsn", dsn},
		{"status", "--dsn", dsn},
		{"dead", "list", "--dsn", dsn},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		code, _, stderr := runArgs(t, ctx, args...)
		cancel()
		line := lastLine(stderr)
		if code != ExitConfig || !strings.Contains(line, "Access denied") || !strings.Contains(line, "check the user, password and database in the DSN") {
			t.Errorf("%s: exit %d, error %q", args[0], code, line)
		}
		if strings.Contains(stderr, "keep trying") {
			t.Errorf("%s: promises a retry it will not make: %s", args[0], stderr)
		}
	}
}

// TestNoStateDatabase: status and dead list against a server where run
// never ran say so, name the state databases that are there, and exit 2.
func TestNoStateDatabase(t *testing.T) {
	srv := mysqltest.Shared(t)
	missing := srv.CreateDB(t, "nostate") // exists, but holds no state
	for _, args := range [][]string{
		{"status", "--dsn", srv.DSN, "--state-db", missing},
		{"dead", "list", "--dsn", srv.DSN, "--state-db", missing},
		{"status", "--dsn", srv.DSN, "--state-db", missing + "_none"},
	} {
		code, _, stderr := runCmd(t, args...)
		line := lastLine(stderr)
		if code != ExitConfig || !strings.Contains(line, "no cdcout state in database "+args[len(args)-1]) ||
			!strings.Contains(line, "--state-db") || strings.Contains(line, "doesn't exist") {
			t.Errorf("%v: exit %d, error %q", args, code, line)
		}
	}
}

// TestRunRefusesUnknownKeyColumn: a sink's key: naming a column a table
// it takes lacks is a configuration to fix (exit 2), named with the sink,
// the column and the table.
func TestRunRefusesUnknownKeyColumn(t *testing.T) {
	srv := mysqltest.Shared(t)
	src := srv.CreateDB(t, "keycol")
	srv.Exec(t, "CREATE TABLE `"+src+"`.orders (id INT PRIMARY KEY, customer INT)")
	file := filepath.Join(t.TempDir(), "cdcout.yaml")
	cfg := "dsn: '" + srv.DSN + "'\nstate_db: " + src + "_state\nhttp_addr: 'off'\ntables: ['" + src + ".*']\n" +
		"sinks:\n  - name: k\n    url: kafka://127.0.0.1:1/t\n    key: [custmer]\n"
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code, _, stderr := runArgs(t, ctx, "run", "--config", file)
	if want := `sinks[0] (k).key: column "custmer" is not a column of ` + src + ".orders"; code != ExitConfig || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, %s; want exit 2 with %q", code, stderr, want)
	}
}
