package e2e

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// stateReceiver applies webhook deliveries of table t (id, v, s) in
// arrival order, dropping redeliveries by id: the consumer's view of the
// table.
type stateReceiver struct {
	srv  *httptest.Server
	mu   sync.Mutex
	rows map[int64]string // id → "v/s"
	seen map[string]bool
	ops  map[string]int
	bad  []string
}

func newStateReceiver(t testing.TB) *stateReceiver {
	r := &stateReceiver{rows: map[int64]string{}, seen: map[string]bool{}, ops: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var env struct {
			ID    string `json:"id"`
			Op    string `json:"op"`
			Key   struct{ ID int64 }
			After *struct {
				V int64
				S string
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := json.Unmarshal(b, &env); err != nil || env.ID == "" {
			r.bad = append(r.bad, fmt.Sprintf("%v: %.200s", err, b))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if r.seen[env.ID] {
			return
		}
		r.seen[env.ID] = true
		r.ops[env.Op]++
		switch {
		case env.Op == "d":
			delete(r.rows, env.Key.ID)
		case env.After != nil:
			r.rows[env.Key.ID] = fmt.Sprintf("%d/%s", env.After.V, env.After.S)
		}
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// backfillRow is the snapshot's row of backfills (there is one).
func backfillRow(db *sql.DB, stateDB string) (status string, rows int64, err error) {
	err = db.QueryRow("SELECT status, rows_done FROM `"+stateDB+"`.backfills").Scan(&status, &rows)
	return status, rows, err
}

// TestSnapshotKillAndFailover runs `cdcout run` with a snapshot: initial
// sink on a table under concurrent writes, SIGKILLs the replica in the
// middle of the snapshot and restarts it, starts a second replica, and
// SIGKILLs whichever holds the enqueue lease while the snapshot is still
// running: the survivor resumes it. The consumer's final state must equal
// the table. CDCOUT_SNAPSHOT_ROWS sizes the table (default 20,000; the
// issue's figure is 200,000).
func TestSnapshotKillAndFailover(t *testing.T) {
	n := mysqltest.BenchEnv("CDCOUT_SNAPSHOT_ROWS", 20_000)
	srv := mysqltest.Shared(t)
	src := srv.CreateDB(t, "e2e_snap")
	stateDB := srv.CreateDB(t, "e2e_snap_state")
	t.Cleanup(func() { srv.Exec(t, "DROP DATABASE IF EXISTS `"+stateDB+"_watermark`") })
	table := "`" + src + "`.t"
	srv.Exec(t, "CREATE TABLE "+table+" (id INT PRIMARY KEY, v BIGINT NOT NULL, s VARCHAR(40) NOT NULL)",
		fmt.Sprintf("INSERT INTO %s SELECT seq, seq, CONCAT('row', seq) FROM %s", table, mysqltest.Seq(n)))
	db := srv.Open(t)
	recv := newStateReceiver(t)

	// Chunks of 50 rows make the snapshot long enough to be killed in.
	cfgPath := filepath.Join(t.TempDir(), "cdcout.yaml")
	args := runConfig(t, cfgPath, fmt.Sprintf(`instance: snapk
lease_ttl: 1s
claim_lease: 3s
http_addr: "off"
backfill_chunk_size: 50
shutdown_timeout: 5s
sinks:
  - name: hook
    url: %s
    snapshot: initial
    timeout: 2s
    batch_size: 100
    concurrency: 8
`, recv.srv.URL), srv.DSN, stateDB, src, "now", "gtid")
	replica := func(id string) []string { return append(append([]string(nil), args...), "--replica-id", id) }
	log := newLogFile(t, "snapshot")

	stopWriter := mysqltest.Churn(t, db, table, n, 5, time.Millisecond)
	defer stopWriter()

	// waitRows waits until the snapshot has at least rows done, and
	// fails if it finished first (the kill would not be mid-snapshot).
	waitRows := func(rows int64, what string) int64 {
		t.Helper()
		var got int64
		waitFor(t, 90*time.Second, func() (bool, string) {
			status, r, err := backfillRow(db, stateDB)
			if err != nil {
				return false, fmt.Sprintf("%s: no backfill yet (%v)", what, err)
			}
			if status != "running" {
				t.Fatalf("%s: the snapshot is %s with %d rows before the kill; it must still run (raise CDCOUT_SNAPSHOT_ROWS)", what, status, r)
			}
			got = r
			return r >= rows, fmt.Sprintf("%s: %d rows done, waiting for %d", what, r, rows)
		})
		return got
	}

	p1 := startCdcout(t, log, replica("r1")...)
	atKill := waitRows(int64(n/5), "first kill")
	p1.kill()
	t.Logf("SIGKILL of the only replica with %d of %d rows done", atKill, n)

	p1 = startCdcout(t, log, replica("r1")...)
	p2 := startCdcout(t, log, replica("r2")...)
	atFailover := waitRows(atKill+int64(n/5), "failover")
	var holder string
	if err := db.QueryRow("SELECT holder FROM `" + stateDB + "`.leases WHERE name = 'enqueue/snapk' AND expires_at > NOW(6)").Scan(&holder); err != nil {
		t.Fatalf("enqueue lease holder: %v", err)
	}
	survivor := p2
	if strings.HasPrefix(holder, "r2/") {
		p2.kill()
		survivor = p1
	} else {
		p1.kill()
	}
	t.Logf("SIGKILL of the leader %s with %d of %d rows done", holder, atFailover, n)

	waitFor(t, 120*time.Second, func() (bool, string) {
		status, r, err := backfillRow(db, stateDB)
		return err == nil && status == "done", fmt.Sprintf("snapshot %s, %d rows (%v)", status, r, err)
	})
	writes := stopWriter()
	end := srv.GTIDExecuted(t)
	waitFor(t, 120*time.Second, func() (bool, string) {
		var raw string
		_ = db.QueryRow("SELECT position FROM `" + stateDB + "`.checkpoints WHERE source = 'enqueue/snapk'").Scan(&raw)
		var p struct {
			GTIDSet string `json:"gtid_set"`
		}
		_ = json.Unmarshal([]byte(raw), &p)
		ok, _ := mysqltest.GTIDSetContains(srv.Flavor, p.GTIDSet, end)
		if !ok {
			return false, "checkpoint " + p.GTIDSet + " short of " + end
		}
		records, pending, dead, err := outboxCounts(db, stateDB)
		return err == nil && pending == 0 && dead == 0, fmt.Sprintf("%d records, %d pending, %d dead (%v): %s", records, pending, dead, err, outboxSummary(db, stateDB))
	})
	if code := survivor.stop(15 * time.Second); code != 0 {
		t.Errorf("survivor exit code %d", code)
	}

	compareConsumer(t, recv, db, table, writes)
}

// compareConsumer checks that the consumer's rows equal table's.
func compareConsumer(t *testing.T, recv *stateReceiver, db *sql.DB, table string, writes int) {
	t.Helper()
	want := map[int64]string{}
	rows, err := db.Query("SELECT id, v, s FROM " + table)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, v int64
		var s string
		if err := rows.Scan(&id, &v, &s); err != nil {
			t.Fatal(err)
		}
		want[id] = fmt.Sprintf("%d/%s", v, s)
	}
	rows.Close()
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.bad) > 0 {
		t.Errorf("%d bad deliveries, first: %s", len(recv.bad), recv.bad[0])
	}
	t.Logf("%d writes during the snapshot; deliveries by op %v; %d keys in the table", writes, recv.ops, len(want))
	if recv.ops["r"] == 0 {
		t.Fatal("no snapshot row delivered")
	}
	mysqltest.SameRows(t, "consumer", recv.rows, want)
}
