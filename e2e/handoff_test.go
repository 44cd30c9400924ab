package e2e

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestHandoffBuffer kills the enqueue leader of two replicas while changes
// keep coming. With room in the standby's handoff buffer the new leader
// enqueues the buffered transactions after the checkpoint and continues
// from its own stream; with a tiny buffer (--handoff-buffer-size 5) that
// overflows during the leadership gap it re-reads the binlog from the
// checkpoint instead. Either way every change is in the outbox exactly once.
func TestHandoffBuffer(t *testing.T) {
	for _, c := range []struct {
		name, size, wantLog string
	}{
		{"buffered", "10000", "taking over from the handoff buffer"},
		{"overflow", "5", "handoff buffer does not reach back to the checkpoint"},
	} {
		t.Run(c.name, func(t *testing.T) { testHandoffBuffer(t, c.name, c.size, c.wantLog) })
	}
}

func testHandoffBuffer(t *testing.T, name, size, wantLog string) {
	srv := mysqltest.Shared(t)
	db, src, stateDB, from := srv.NewSource(t, "e2e_handoff_"+name, "id INT PRIMARY KEY, v INT NOT NULL")
	recv := newReceiver(t, func(*envelope) (int, time.Duration) { return 200, 0 })
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cdcout.yaml")
	cfg := fmt.Sprintf(`instance: handoff
lease_ttl: 2s
claim_lease: 4s
http_addr: "off"
enqueue_flush_interval: 10ms
sinks:
  - name: hook
    url: %s/hook
    timeout: 1s
`, recv.srv.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	args := func(id string) []string {
		return []string{"run", "--config", cfgPath, "--dsn", srv.DSN, "--state-db", stateDB, "--tables", src + ".t",
			"--from", from, "--replica-id", id, "--handoff-buffer-size", size, "--log-format", "json"}
	}
	logA, logB := newLogFile(t, "handoff-a-"+name), newLogFile(t, "handoff-b-"+name)
	holder := func() string {
		var h string
		err := db.QueryRow("SELECT holder FROM `" + stateDB + "`.leases WHERE name = 'enqueue/handoff' AND expires_at > NOW(6)").Scan(&h)
		if err != nil && err != sql.ErrNoRows {
			return "" // not migrated yet
		}
		return h
	}
	a := startCdcout(t, logA, args("a")...)
	waitFor(t, 30*time.Second, func() (bool, string) { return strings.HasPrefix(holder(), "a/"), "a does not hold the enqueue lease" })
	changes := 0
	write := func(n int) {
		for range n {
			changes++
			srv.Exec(t, fmt.Sprintf("INSERT INTO `%s`.t (id, v) VALUES (%d, %d)", src, changes, changes))
		}
	}
	write(20)
	b := startCdcout(t, logB, args("b")...)
	waitFor(t, 30*time.Second, func() (bool, string) {
		return logB.count("standby streaming into the handoff buffer") > 0, "b's standby stream did not start"
	})
	write(30)
	// Let a checkpoint the first 50 and b read them.
	waitFor(t, 30*time.Second, func() (bool, string) {
		n, _, _, _ := outboxCounts(db, stateDB)
		return n >= 50, fmt.Sprintf("outbox has %d records, want 50", n)
	})
	time.Sleep(200 * time.Millisecond)
	a.kill()
	write(60) // during the leadership gap
	waitFor(t, 30*time.Second, func() (bool, string) { return strings.HasPrefix(holder(), "b/"), "b did not take over" })
	write(10)
	waitFor(t, 30*time.Second, func() (bool, string) {
		n, pending, dead, _ := outboxCounts(db, stateDB)
		open := pending + dead
		return n >= changes && open == 0, fmt.Sprintf("outbox has %d records (%d undelivered), want %d delivered", n, open, changes)
	})
	if got := logB.count(wantLog); got != 1 {
		t.Errorf("b logged %q %d times, want once", wantLog, got)
	}
	if name == "overflow" && (logB.count(`"dropped_pending":`) == 0 || logB.count(`"dropped_pending":0`) > 0) {
		t.Errorf("b's takeover did not report the changes its buffer dropped (dropped_pending)")
	}
	if code := b.stop(20 * time.Second); code != 0 {
		t.Errorf("b exited with %d after SIGTERM", code)
	}
	rows := readOutbox(t, db, stateDB)
	seen := map[change]int{}
	for _, r := range rows {
		seen[r.env.change()]++
	}
	if len(rows) != changes || len(seen) != changes {
		t.Fatalf("outbox has %d records of %d distinct changes, want %d each", len(rows), len(seen), changes)
	}
	ids := map[string]bool{}
	for _, d := range recv.snapshot() {
		ids[d.webhookID] = true
	}
	if len(ids) != changes {
		t.Errorf("receiver got %d distinct changes, want %d", len(ids), changes)
	}
	t.Logf("%s (--handoff-buffer-size %s): %d changes, %d during the leadership gap; b: %q", name, size, changes, 60, wantLog)
}
