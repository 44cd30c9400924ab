package command

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestTwoInstallationsAndCreateSelect runs the command the way a new user
// would: two installations on one server (different --state-db, the
// default --tables: all). Neither captures the other's state (whose
// sessions write MINIMAL images) nor stops; a CREATE TABLE … SELECT is
// captured as one transaction with GTID change keys, and capture goes on
// after it.
func TestTwoInstallationsAndCreateSelect(t *testing.T) {
	srv := mysqltest.Shared(t)
	user := srv.CreateDB(t, "inst_user")
	stateA := srv.CreateDB(t, "inst_a")
	stateB := srv.CreateDB(t, "inst_b")
	srv.Exec(t, "CREATE TABLE `"+user+"`.src (id INT PRIMARY KEY, v INT)", "INSERT INTO `"+user+"`.src VALUES (1, 1), (2, 2), (3, 3)")
	dir := t.TempDir()
	outA, outB := filepath.Join(dir, "a.jsonl"), filepath.Join(dir, "b.jsonl")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		code   int
		stderr string
	}
	exited := make(chan result, 2)
	dump := func() {
		cancel()
		for range 2 {
			r := <-exited
			t.Logf("exit %d:\n%s", r.code, lastN(r.stderr, 3000))
		}
	}
	db := srv.Open(t)
	// Both start before the CREATE … SELECT: with the default --from now,
	// a replica that leads before its stream has fixed "now" would start
	// after it (CI saw b.jsonl stay empty once).
	from := mysqltest.GTIDPos(t, db)
	deadline := time.Now().Add(60 * time.Second)
	// until polls cond until it holds; a replica that exits first, or the
	// deadline, fails the test (timedOut says why).
	until := func(cond func() bool, timedOut func()) {
		for !cond() {
			select {
			case r := <-exited:
				t.Fatalf("a replica exited (%d): %s", r.code, r.stderr)
			default:
			}
			if time.Now().After(deadline) {
				timedOut()
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// One after the other: urfave/cli's flag parsing is not safe for two
	// apps at once in one process.
	for _, a := range [][2]string{{stateA, outA}, {stateB, outB}} {
		s := a[0]
		go func() {
			code, _, stderr := runArgs(t, ctx, "run", "--dsn", srv.DSN, "--state-db", a[0], "--instance", a[0], "--from", from,
				"--sink", "f=file://"+a[1], "--http-addr", "off", "--log-level", "warn")
			exited <- result{code, stderr}
		}()
		until(func() bool {
			var n int
			_ = db.QueryRow("SELECT COUNT(*) FROM `" + s + "`.replicas WHERE payload LIKE '%\"role\":\"leader\"%'").Scan(&n)
			return n > 0
		}, func() { t.Fatalf("%s never led", s) })
	}
	srv.Exec(t, "CREATE TABLE `"+user+"`.copy (PRIMARY KEY (id)) SELECT id, v FROM `"+user+"`.src",
		"INSERT INTO `"+user+"`.copy VALUES (4, 4)")

	for _, out := range []string{outA, outB} {
		var (
			b      []byte
			copies []string
		)
		until(func() bool {
			b, _ = os.ReadFile(out)
			copies = nil
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, `"table":"copy"`) {
					copies = append(copies, line)
				}
			}
			return len(copies) == 4
		}, func() {
			dump()
			t.Fatalf("%s: %d changes of copy, want 4:\n%s", filepath.Base(out), len(copies), lastN(string(b), 3000))
		})
		for _, line := range copies {
			if strings.Contains(line, `"gtid":""`) || !strings.Contains(line, `"change_key":"g:`) {
				t.Errorf("%s: change without its GTID key: %s", filepath.Base(out), line)
			}
		}
		for _, s := range []string{stateA, stateB} {
			if strings.Contains(string(b), `"db":"`+s+`"`) {
				t.Errorf("%s captured cdcout state of %s", filepath.Base(out), s)
			}
		}
	}
}
