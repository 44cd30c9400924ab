package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestChaos runs three replicas of the real binary against one database
// (its own server, so it can be restarted) and an httptest receiver, under
// a writer load over three tables with two 10,000-row transactions, and
// does to them what production does: ≥ 10 SIGKILLs of whichever replica
// holds the enqueue lease or a drain lease, a SIGSTOP of the leader for
// longer than the lease TTL (fencing), a restart of the database server and
// a graceful SIGTERM handover. Afterwards the outbox holds exactly one row
// per (change, pipe), the receiver has every change, in per-key order,
// duplicates only under the same delivery key, and nothing is dead.
func TestChaos(t *testing.T) {
	inBothModes(t, testChaos)
}

const (
	chaosKills = 10
	chaosTTL   = 3 * time.Second
	bigRows    = 10_000
)

// chaosReplica is one replica slot: its id and current process.
type chaosReplica struct {
	id string
	p  *proc
}

// lockedWriter runs writer transactions one at a time under mu, so the
// test can pause the load (database restart) between transactions.
type lockedWriter struct {
	w  *writer
	mu sync.Mutex
}

func (lw *lockedWriter) run(ctx context.Context) error {
	lw.w.rows = make([]map[int]bool, len(lw.w.tables))
	for i := range lw.w.rows {
		lw.w.rows[i] = map[int]bool{}
	}
	for ctx.Err() == nil {
		n := 1
		switch r := rand.IntN(100); {
		case r < 2:
			n = 30
		case r < 25:
			n = 2 + rand.IntN(4)
		}
		lw.mu.Lock()
		err := lw.w.tx(n)
		lw.mu.Unlock()
		if err != nil {
			return err
		}
		time.Sleep(time.Duration(8+rand.IntN(8)) * time.Millisecond)
	}
	return nil
}

func testChaos(t *testing.T, mode string) {
	srv := mysqltest.Start(t, mysqltest.Options{})
	tables := []string{"a", "b", "c"}
	db, src, stateDB, from := writerSource(t, srv, "e2e_chaos_"+mode, tables...)
	db.SetMaxOpenConns(8)
	start := time.Now()

	recv := newModeReceiver(t, mode, jitteryAnswer(2, 50, 150, 3))
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cdcout.yaml")
	// A long claim lease: a SIGKILLed drain holder's claimed rows must not
	// wait it out — the pipe's next holder returns them to pending when it
	// takes the drain lease (their claimer is no longer a member).
	cfg := fmt.Sprintf(`instance: chaos
lease_ttl: %s
claim_lease: 2m
http_addr: "off"
enqueue_batch_size: 200
enqueue_flush_interval: 20ms
shutdown_timeout: 10s
sinks:
  - name: hook
    url: %s/hook
    timeout: 1s
    batch_size: 64
    concurrency: 8
`, chaosTTL, recv.srv.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	log := newLogFile(t, "chaos-"+mode)
	replicas := []*chaosReplica{{id: "r1"}, {id: "r2"}, {id: "r3"}}
	startReplica := func(r *chaosReplica) {
		r.p = startCdcout(t, log, "run", "--config", cfgPath, "--dsn", srv.DSN, "--state-db", stateDB,
			"--tables", src+".*", "--from", from, "--change-identity", mode, "--replica-id", r.id, "--log-format", "json")
	}
	byID := func(holder string) *chaosReplica {
		id, _, _ := strings.Cut(holder, "/")
		for _, r := range replicas {
			if r.id == id {
				return r
			}
		}
		return nil
	}
	for _, r := range replicas {
		startReplica(r)
	}

	lw := &lockedWriter{w: &writer{db: db, keys: 40}}
	for _, tbl := range tables {
		lw.w.tables = append(lw.w.tables, "`"+src+"`."+tbl)
	}
	wr := startLoad(lw.run)
	defer wr.stop()
	var bigChanges atomic.Int64
	bigTx := func(q string) {
		lw.mu.Lock()
		defer lw.mu.Unlock()
		res, err := db.Exec(q)
		if err != nil {
			t.Fatalf("big transaction: %v", err)
		}
		n, _ := res.RowsAffected()
		if n != bigRows {
			t.Fatalf("big transaction changed %d rows, want %d", n, bigRows)
		}
		bigChanges.Add(n)
	}

	dbNow := func() string {
		var now string
		if err := db.QueryRow("SELECT DATE_FORMAT(NOW(6), '%Y-%m-%d %H:%i:%s.%f')").Scan(&now); err != nil {
			t.Fatalf("read database clock: %v", err)
		}
		return now
	}
	enqueueHolder := func() (string, uint64) {
		var h string
		var epoch uint64
		err := db.QueryRow("SELECT holder, epoch FROM `"+stateDB+"`.leases WHERE name = 'enqueue/chaos' AND expires_at > NOW(6)").Scan(&h, &epoch)
		if err != nil && err != sql.ErrNoRows {
			t.Logf("read enqueue lease: %v", err)
		}
		return h, epoch
	}
	drainHolders := func() map[string]string {
		out := map[string]string{}
		rows, err := db.Query("SELECT name, holder FROM `" + stateDB + "`.leases WHERE name LIKE 'drain/%' AND expires_at > NOW(6)")
		if err != nil {
			t.Logf("read drain leases: %v", err)
			return out
		}
		defer rows.Close()
		for rows.Next() {
			var n, h string
			if rows.Scan(&n, &h) == nil {
				out[strings.TrimPrefix(n, "drain/")] = h
			}
		}
		return out
	}
	// firstRowBy waits for the first claim (outbox row) written after the
	// database time since by a replica other than exclude, and returns the
	// wall time it was seen.
	firstRowBy := func(since, exclude string, timeout time.Duration) time.Time {
		waitFor(t, timeout, func() (bool, string) {
			var n int
			if err := db.QueryRow("SELECT COUNT(*) FROM `"+stateDB+"`.claims WHERE created_at > ? AND claimed_by <> ?", since, exclude).Scan(&n); err != nil {
				return false, err.Error()
			}
			h, _ := enqueueHolder()
			return n > 0, fmt.Sprintf("no outbox row by a new leader since %s (enqueue lease holder %q)", since, h)
		})
		return time.Now()
	}
	waitHolder := func(timeout time.Duration) *chaosReplica {
		var r *chaosReplica
		waitFor(t, timeout, func() (bool, string) {
			h, _ := enqueueHolder()
			r = byID(h)
			return r != nil && !r.p.exited(), "no live enqueue lease holder"
		})
		return r
	}
	checkAlive := func() {
		for _, r := range replicas {
			if r.p.exited() {
				t.Fatalf("replica %s exited on its own: %v", r.id, r.p.err)
			}
		}
		if err := wr.failed(); err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	// Let every replica start and the drain leases spread.
	waitHolder(30 * time.Second)
	waitFor(t, 30*time.Second, func() (bool, string) {
		d := drainHolders()
		return len(d) == len(tables), fmt.Sprintf("drain leases held: %v", d)
	})

	var (
		kills, enqueueKills, drainKills int
		maxTakeover, maxDrainTakeover   time.Duration
		takeovers                       []time.Duration
	)
	for kills < chaosKills {
		checkAlive()
		switch kills {
		case 2:
			bigTx("INSERT INTO `" + src + "`.c (id, v, note) SELECT 1000000 + seq, 0, 'big' FROM " + mysqltest.Seq(10000))
		case 6:
			bigTx("DELETE FROM `" + src + "`.c WHERE id > 1000000")
		}
		time.Sleep(time.Duration(300+rand.IntN(700)) * time.Millisecond)
		if kills%2 == 0 {
			// The enqueue leader.
			r := waitHolder(30 * time.Second)
			since := dbNow()
			killedAt := time.Now()
			r.p.kill()
			kills++
			enqueueKills++
			seen := firstRowBy(since, r.id, 30*time.Second)
			d := seen.Sub(killedAt)
			takeovers = append(takeovers, d)
			maxTakeover = max(maxTakeover, d)
			startReplica(r)
			continue
		}
		// A drain lease holder, preferably not the leader.
		leader, _ := enqueueHolder()
		var pipe, holder string
		for p, h := range drainHolders() {
			if pipe == "" || h != leader {
				pipe, holder = p, h
			}
		}
		r := byID(holder)
		if r == nil {
			continue
		}
		killedAt := time.Now()
		r.p.kill()
		kills++
		drainKills++
		waitFor(t, 30*time.Second, func() (bool, string) {
			h := drainHolders()[pipe]
			return h != "" && h != holder, fmt.Sprintf("pipe %s not taken over (holder %q)", pipe, h)
		})
		maxDrainTakeover = max(maxDrainTakeover, time.Since(killedAt))
		startReplica(r)
	}

	// SIGSTOP the leader for longer than the TTL: another replica takes
	// over; when it continues, its writes are fenced and it steps down.
	checkAlive()
	r := waitHolder(30 * time.Second)
	_, oldEpoch := enqueueHolder()
	lostBefore := log.count(`"enqueue lease lost`)
	if err := r.p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		h, _ := enqueueHolder()
		return h != "" && byID(h) != r, "no other replica took over from the stopped leader"
	})
	checkpointHolder := func() (string, uint64) {
		var h string
		var epoch uint64
		if err := db.QueryRow("SELECT holder, epoch FROM `"+stateDB+"`.checkpoints WHERE source = 'enqueue/chaos'").Scan(&h, &epoch); err != nil {
			t.Fatal(err)
		}
		return h, epoch
	}
	// The new leader writes a checkpoint while the old one is stopped.
	waitFor(t, 30*time.Second, func() (bool, string) {
		h, epoch := checkpointHolder()
		return byID(h) != r && epoch > oldEpoch, fmt.Sprintf("checkpoint still by %s at epoch %d", h, epoch)
	})
	if err := r.p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, func() (bool, string) {
		return log.count(`"enqueue lease lost`) > lostBefore, "the resumed old leader did not notice it lost the lease"
	})
	// Its enqueue writes matched zero rows: the checkpoint is still the
	// new leader's.
	if cpHolder, cpEpoch := checkpointHolder(); byID(cpHolder) == r || cpEpoch <= oldEpoch {
		t.Errorf("checkpoint written by %s at epoch %d after the stopped leader (epoch %d) resumed", cpHolder, cpEpoch, oldEpoch)
	}

	// Restart the database server, the load paused meanwhile.
	checkAlive()
	lw.mu.Lock()
	restartAt := time.Now()
	// A clean restart (SIGTERM), as an operator's or a managed service's
	// maintenance restart: a SIGKILL of this test server (sync_binlog=0) in
	// the middle of a 10,000-row transaction can leave a torn binlog event
	// that MariaDB itself refuses to read past, which no client can fix.
	if err := srv.RestartClean(); err != nil {
		lw.mu.Unlock()
		t.Fatalf("restart database: %v", err)
	}
	lw.mu.Unlock()
	waitHolder(60 * time.Second)
	sinceRestart := dbNow()
	waitFor(t, 60*time.Second, func() (bool, string) {
		var n int
		err := db.QueryRow("SELECT COUNT(*) FROM `"+stateDB+"`.claims WHERE created_at > ?", sinceRestart).Scan(&n)
		return err == nil && n > 0, fmt.Sprintf("no outbox row after the database restart (%v)", err)
	})
	restartRecovery := time.Since(restartAt)

	// Graceful handover: SIGTERM the leader; a peer takes over within
	// about one retry interval.
	checkAlive()
	r = waitHolder(30 * time.Second)
	since := dbNow()
	termAt := time.Now()
	_ = r.p.cmd.Process.Signal(syscall.SIGTERM)
	seen := firstRowBy(since, r.id, 30*time.Second)
	handover := seen.Sub(termAt)
	select {
	case <-r.p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("replica %s did not stop within 20s of SIGTERM", r.id)
	}
	if code := r.p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("replica %s exited with %d after SIGTERM, want 0", r.id, code)
	}
	startReplica(r)

	// Drain everything, then stop every replica gracefully.
	time.Sleep(time.Second)
	if err := wr.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	n := int(lw.w.changes.Load() + bigChanges.Load())
	// Nothing may be lost, so the wait outlasts one claim lease (2m): a row
	// whose live claimer lost track of it is redelivered when its claim
	// expires. That is a stall, not a loss; it is reported below so a
	// regression in the membership release shows in the log.
	drainStart := time.Now()
	waitFor(t, 200*time.Second, func() (bool, string) {
		checkAlive()
		recs, open, _, err := outboxCounts(db, stateDB)
		if err != nil {
			return false, err.Error()
		}
		return recs >= n && open == 0, fmt.Sprintf("outbox has %d records (want %d), %d pending (claimed or not): %s", recs, n, open, outboxSummary(db, stateDB))
	})
	if d := time.Since(drainStart); d > 60*time.Second {
		t.Logf("NOTE: the final drain took %s; some rows waited out their claim lease", d.Round(time.Second))
	}
	for _, r := range replicas {
		if code := r.p.stop(20 * time.Second); code != 0 {
			t.Errorf("replica %s exited with %d after SIGTERM, want 0", r.id, code)
		}
	}
	elapsed := time.Since(start)

	_, wantByTable := tailCommitted(t, srv.DSN, src+".*", from, n)
	rows := readOutbox(t, db, stateDB)
	perPipe := map[string]map[change]int{}
	ids := map[string]change{}
	for _, r := range rows {
		if perPipe[r.pipe] == nil {
			perPipe[r.pipe] = map[change]int{}
		}
		perPipe[r.pipe][r.env.change()]++
		ids[r.id] = r.env.change()
		if r.status != "delivered" {
			t.Errorf("outbox record %s of %s is %s, want delivered", r.id, r.pipe, r.status)
		}
	}
	for _, tbl := range tables {
		pipe := "chaos:" + src + "." + tbl + ":hook"
		checkOncePerChange(t, pipe, wantByTable[tbl], perPipe[pipe])
	}
	dels := recv.snapshot()
	hookIDs := map[change]string{}
	var envs []envelope
	for _, d := range dels {
		c := d.env.change()
		if prev, ok := hookIDs[c]; ok && prev != d.webhookID {
			t.Errorf("change %v delivered under two delivery keys: %s and %s", c, prev, d.webhookID)
		}
		hookIDs[c] = d.webhookID
		if oc, ok := ids[d.webhookID]; !ok || oc != c {
			t.Errorf("delivery %s (%v) is not the outbox record of that change", d.webhookID, c)
		}
		envs = append(envs, d.env)
	}
	if got := len(hookIDs); got != n {
		t.Errorf("receiver got %d distinct changes, want %d; not delivered: %s", got, n, undelivered(db, stateDB, rows, hookIDs))
	}
	for _, v := range orderViolations(envs) {
		t.Errorf("receiver per-key order: %s", v)
	}
	t.Logf("mode %s: %d changes (%d in two %d-row transactions), %d outbox records; %d SIGKILLs (%d enqueue leader, %d drain holder), 1 SIGSTOP > TTL, 1 database restart (first row %s after it), 1 SIGTERM; "+
		"%d enqueue lease takeovers (%d from the handoff buffer, %d re-reading from the checkpoint), %d fenced steps down; %d drain takeovers returned a dead claimer's rows; duplicates delivered: %d of %d requests; "+
		"takeover after SIGKILL of the leader (kill → first new outbox row, TTL %s): max %s, all %v; drain pipe taken over within %s; graceful handover (SIGTERM → first new outbox row) %s; %s in all",
		mode, n, bigChanges.Load(), bigRows, len(rows), kills, enqueueKills, drainKills, restartRecovery.Round(time.Millisecond),
		log.count("enqueue lease acquired"), log.count("taking over from the handoff buffer"), log.count("re-reading the binlog from it"),
		log.count(`"enqueue lease lost`), log.count("released rows claimed by replicas that are gone"), len(dels)-len(hookIDs), len(dels),
		chaosTTL, maxTakeover.Round(time.Millisecond), roundAll(takeovers), maxDrainTakeover.Round(time.Millisecond), handover.Round(time.Millisecond), elapsed.Round(time.Second))
	if limit := chaosTTL + 2*time.Second; maxTakeover > limit {
		t.Logf("NOTE: max takeover %s exceeds the %s target", maxTakeover, limit)
	}
}

func roundAll(ds []time.Duration) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Round(10*time.Millisecond).String())
	}
	return out
}

// undelivered says where the outbox holds the changes the receiver never
// got: per segment (or row), the count, the first record id,
// and the segment's state, for a failure message.
func undelivered(db *sql.DB, stateDB string, rows []outboxRow, got map[change]string) string {
	type where struct{ segment, status string }
	count := map[where]int{}
	first := map[where]string{}
	var order []where
	for _, r := range rows {
		if _, ok := got[r.env.change()]; ok {
			continue
		}
		w := where{r.segment, string(r.status)}
		if count[w] == 0 {
			order = append(order, w)
			first[w] = r.id
		}
		count[w]++
	}
	var parts []string
	for _, w := range order[:min(len(order), 8)] {
		desc := fmt.Sprintf("%d in ", count[w])
		if w.segment == "" {
			desc += "rows"
		} else {
			var recs, attempts int
			var claimer int64
			var status string
			err := db.QueryRow("SELECT status, records, attempts, claimer FROM `"+stateDB+"`.segments WHERE id = ?", w.segment).Scan(&status, &recs, &attempts, &claimer)
			desc += fmt.Sprintf("segment %s (%s, %d records, %d attempts, claimer %d, err %v)", w.segment, status, recs, attempts, claimer, err)
		}
		parts = append(parts, desc+fmt.Sprintf(" status %s, first record %s", w.status, first[w]))
	}
	return fmt.Sprintf("%d places: %s", len(order), strings.Join(parts, "; "))
}
