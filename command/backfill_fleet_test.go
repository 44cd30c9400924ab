package command

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestBackfillFeedsTheFleetsSinks: after cdcout run --sink hook=URL, a
// cdcout backfill given only --dsn and --table feeds the pipes the running
// fleet serves for that table (here hook, not the sink that leaves the
// table out), through the running leader; a --sink the fleet lacks is
// refused with the fleet's sinks named.
func TestBackfillFeedsTheFleetsSinks(t *testing.T) {
	srv := mysqltest.Shared(t)
	src := srv.CreateDB(t, "bff_src")
	stateDB := srv.CreateDB(t, "bff_state")
	t.Cleanup(func() { srv.Exec(t, "DROP DATABASE IF EXISTS `"+backfill.WatermarkDB(stateDB)+"`") })
	srv.Exec(t, "CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY, v INT)", "INSERT INTO `"+src+"`.t VALUES (1, 1), (2, 2), (3, 3)")

	var mu sync.Mutex
	got := map[string]int{}
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var env struct {
			Op string `json:"op"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &env)
		mu.Lock()
		got[env.Op]++
		mu.Unlock()
	}))
	defer hook.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		code, _, _ := runArgs(t, ctx, "run", "--dsn", srv.DSN, "--state-db", stateDB, "--instance", "bff",
			"--sink", "hook="+hook.URL, "--config", yamlFile(t, "sinks:\n  - name: other\n    url: \"stdout:\"\n    tables: {include: [\"nosuch.*\"]}\n"),
			"--http-addr", "off", "--log-level", "error")
		done <- code
	}()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-done
		}
	}()
	db := srv.Open(t)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		_ = db.QueryRow("SELECT COUNT(*) FROM `" + stateDB + "`.replicas WHERE payload LIKE '%\"role\":\"leader\"%'").Scan(&n)
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("cdcout run never led")
		}
		time.Sleep(50 * time.Millisecond)
	}

	base := []string{"backfill", "--dsn", srv.DSN, "--state-db", stateDB, "--instance", "bff", "--table", src + ".t", "--log-level", "error"}
	code, _, stderr := runCmd(t, append(base, "--sink", "nosuch")...)
	if code != ExitConfig || !strings.Contains(stderr, `"nosuch": the running fleet of instance "bff" has no such sink (its sinks: hook, other)`) {
		t.Errorf("--sink nosuch: exit %d, %s", code, stderr)
	}
	code, out, stderr := runCmd(t, base...)
	if code != ExitOK || !strings.Contains(out, src+".t → hook\n") {
		t.Fatalf("backfill: exit %d\nstdout %s\nstderr %s", code, out, stderr)
	}
	for {
		mu.Lock()
		n := got["r"]
		mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hook got %d backfilled rows, want 3", n)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Once the fleet has stopped, there is nothing to feed: said, exit 2.
	cancel()
	<-done
	stopped = true
	code, _, stderr = runCmd(t, base...)
	if code != ExitConfig || !strings.Contains(stderr, "give --sink [NAME=]URL or --config") {
		t.Errorf("without a running fleet: exit %d, %s", code, stderr)
	}
}
