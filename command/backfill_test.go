package command

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/engine"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/outbox"
)

func writeBackfillConfig(t *testing.T, from, hookURL string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cdcout.yaml")
	y := fmt.Sprintf("from: %q\nlease_ttl: 2s\nclaim_lease: 11s\nhttp_addr: \"off\"\nsinks:\n  - name: hook\n    url: %s\n  - name: other\n    url: \"stdout:\"\n    tables:\n      include: [\"nosuch.*\"]\n", from, hookURL)
	if err := os.WriteFile(p, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBackfillKillAndResume SIGKILLs the real binary in the middle of a
// backfill, runs the same command again, and checks that every row
// arrives and that the outbox holds exactly one "r" row per key and pipe:
// with watermarks, and --read-only with a source user that has only
// SELECT on the table's database and REPLICATION SLAVE, REPLICATION
// CLIENT (the state database reached as root through --state-dsn); the
// read-only run leaves no watermark database behind.
func TestBackfillKillAndResume(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "cdcout")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/cdcout/cdcout").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Run("watermarks", func(t *testing.T) { testBackfillKillAndResume(t, bin, false) })
	t.Run("read-only", func(t *testing.T) { testBackfillKillAndResume(t, bin, true) })
}

func testBackfillKillAndResume(t *testing.T, bin string, readOnly bool) {
	const n = 20_000
	srv := mysqltest.Shared(t)
	src := srv.CreateDB(t, "bfk_src")
	stateDB := srv.CreateDB(t, "bfk_state")
	t.Cleanup(func() { srv.Exec(t, "DROP DATABASE IF EXISTS `"+backfill.WatermarkDB(stateDB)+"`") })
	srv.Exec(t, "CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY, v BIGINT NOT NULL)",
		fmt.Sprintf("INSERT INTO `%s`.t SELECT seq, seq FROM %s", src, mysqltest.Seq(n)))
	db := srv.Open(t)
	sourceDSN := srv.DSN
	var extra []string
	if readOnly {
		user, pw := "bfro_"+src[len(src)-6:], "ro-pass-4821"
		srv.Exec(t, "CREATE USER IF NOT EXISTS '"+user+"'@'%' IDENTIFIED BY '"+pw+"'",
			"GRANT SELECT ON `"+src+"`.* TO '"+user+"'@'%'",
			"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+user+"'@'%'")
		t.Cleanup(func() { srv.Exec(t, "DROP USER IF EXISTS '"+user+"'@'%'") })
		sourceDSN = fmt.Sprintf("%s:%s@tcp(127.0.0.1:%d)/", user, pw, srv.Port)
		extra = []string{"--read-only", "--state-dsn", srv.DSN}
	}
	from := mysqltest.GTIDPos(t, db)
	var mu sync.Mutex
	got := map[int64]int{}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var env struct {
			Op  string `json:"op"`
			Key struct{ ID int64 }
		}
		b, _ := io.ReadAll(r.Body)
		if json.Unmarshal(b, &env) != nil || env.Op != "r" {
			t.Errorf("unexpected delivery %s", b)
			return
		}
		mu.Lock()
		got[env.Key.ID]++
		mu.Unlock()
	}))
	defer hook.Close()
	cfgPath := writeBackfillConfig(t, from, hook.URL)
	args := append([]string{"backfill", "--dsn", sourceDSN, "--state-db", stateDB, "--instance", "kr", "--config", cfgPath,
		"--table", src + ".t", "--chunk-size", "200", "--log-format", "json", "--log-level", "info"}, extra...)

	logs := t.TempDir()
	start := func(i int) (*exec.Cmd, *os.File) {
		cmd := exec.Command(bin, args...)
		f, err := os.Create(filepath.Join(logs, fmt.Sprintf("backfill%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, f
	}
	dump := func() {
		for i := 1; i <= 2; i++ {
			b, _ := os.ReadFile(filepath.Join(logs, fmt.Sprintf("backfill%d.log", i)))
			t.Logf("backfill%d.log:\n%s", i, lastN(string(b), 3000))
		}
	}
	rowsDone := func() (int64, string) {
		var done int64
		var status string
		_ = db.QueryRow("SELECT rows_done, status FROM `"+stateDB+"`.backfills ORDER BY created_at LIMIT 1").Scan(&done, &status)
		return done, status
	}

	cmd, f := start(1)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if done, _ := rowsDone(); done > 0 {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			dump()
			t.Fatal("backfill made no progress")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	f.Close()
	killedAt, status := rowsDone()
	if killedAt >= n || status != backfill.StatusRunning {
		dump()
		t.Fatalf("killed at %d rows with status %s: not mid-backfill", killedAt, status)
	}
	t.Logf("killed after %d of %d rows", killedAt, n)

	cmd, f = start(2)
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	select {
	case err := <-waitErr:
		f.Close()
		if err != nil {
			dump()
			t.Fatalf("second backfill: %v", err)
		}
	case <-time.After(90 * time.Second):
		_ = cmd.Process.Kill()
		dump()
		t.Fatal("second backfill did not finish")
	}
	if b, _ := os.ReadFile(filepath.Join(logs, "backfill2.log")); !bytes.Contains(b, []byte("continuing the unfinished backfill")) {
		dump()
		t.Fatal("second run did not continue the first backfill")
	}
	recs, err := outbox.ReadRecords(context.Background(), db, stateDB, "%")
	if err != nil {
		t.Fatal(err)
	}
	count, other := 0, 0
	keys, ids := map[string]bool{}, map[string]bool{}
	for _, r := range recs {
		switch {
		case r.Pipe != "kr:"+src+".t:hook":
			other++
		case r.Op == "r":
			count++
			keys[r.Key] = true
			ids[r.ChangeKey] = true
		}
	}
	if count != n || len(keys) != n || len(ids) != n {
		dump()
		t.Fatalf("outbox holds %d r records for %d keys (%d change keys), want exactly %d each", count, len(keys), len(ids), n)
	}
	if other != 0 {
		t.Fatalf("%d outbox records for other pipes (watermarks or the unsubscribed sink)", other)
	}
	if readOnly {
		var dbs int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", backfill.WatermarkDB(stateDB)).Scan(&dbs); err != nil || dbs != 0 {
			t.Fatalf("read-only backfill: %d watermark databases (%v), want none", dbs, err)
		}
	}

	// A replica delivers what the backfill left pending.
	cfg := config.Default()
	cfg.DSN = config.DSN(srv.DSN)
	cfg.StateDB, cfg.Instance, cfg.HTTPAddr, cfg.LeaseTTL, cfg.ClaimLease = stateDB, "kr", "off", 2*time.Second, 11*time.Second
	cfg.Sinks = []config.Sink{{Name: "hook", URL: hook.URL}}
	cfg.FillSinkDefaults()
	e, err := engine.New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer wait.Background(t, 60*time.Second, e.Run)()
	deadline = time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		have := len(got)
		mu.Unlock()
		if have == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d keys delivered", have, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for id := int64(1); id <= n; id++ {
		if got[id] == 0 {
			t.Fatalf("key %d never delivered", id)
		}
	}

	// status lists it as done.
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"cdcout", "backfill", "status", "--dsn", srv.DSN, "--state-db", stateDB}, nil, &out, &errOut); code != ExitOK {
		t.Fatalf("backfill status exit %d: %s", code, errOut.String())
	}
	mode := " watermarks "
	if readOnly {
		mode = " read-only "
	}
	if !strings.Contains(out.String(), src+".t") || !strings.Contains(out.String(), " done ") || !strings.Contains(out.String(), mode) {
		t.Fatalf("backfill status:\n%s", out.String())
	}
}

// TestBackfillBadInput: each mistake exits 2 with a clear message and
// enqueues nothing.
func TestBackfillBadInput(t *testing.T) {
	srv := mysqltest.Shared(t)
	src := srv.CreateDB(t, "bfbad_src")
	stateDB := srv.CreateDB(t, "bfbad_state")
	t.Cleanup(func() { srv.Exec(t, "DROP DATABASE IF EXISTS `"+backfill.WatermarkDB(stateDB)+"`") })
	srv.Exec(t, "CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY, v INT)", "INSERT INTO `"+src+"`.t VALUES (1, 1)",
		"CREATE TABLE `"+src+"`.nokey (a INT, b INT)")
	cfgPath := writeBackfillConfig(t, "now", "http://127.0.0.1:9/")
	base := []string{"cdcout", "backfill", "--dsn", srv.DSN, "--state-db", stateDB, "--config", cfgPath, "--log-level", "error"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--table", src + ".missing"}, "does not exist"},
		{[]string{"--table", src + ".nokey"}, "no primary key"},
		{[]string{"--table", src + ".t", "--where", "v >"}, "SQL syntax"},
		{[]string{"--table", src + ".t", "--where", "nope = 1"}, "Unknown column 'nope'"},
		{[]string{"--table", src + ".t", "--sink", "nosuch"}, `"nosuch": no such sink`},
		{[]string{"--table", src + ".t", "--sink", "other"}, "does not subscribe"},
		{[]string{"--table", "nodot"}, "want db.table"},
		{[]string{"--resume", "bfnosuch"}, "no such backfill"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append(append([]string{}, base...), tc.args...), nil, &out, &errOut)
		if code != ExitConfig || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
		if strings.Contains(errOut.String(), "@tcp(") && strings.Contains(srv.DSN, ":") && strings.Contains(errOut.String(), srv.DSN) {
			t.Errorf("DSN echoed: %s", errOut.String())
		}
	}
	db := srv.Open(t)
	if recs, err := outbox.ReadRecords(context.Background(), db, stateDB, "%"); err == nil && len(recs) != 0 {
		t.Fatalf("%d outbox records after bad input", len(recs))
	}
}
