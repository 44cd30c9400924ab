package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/redistest"
)

// TestCrashRecovery kills one `cdcout run` (an HTTP, a file and a broker
// sink — Redis Streams in gtid mode, Pub/Sub in digest mode — two tables) with SIGKILL at 30+ random moments under a steady write load and
// restarts it each time. Afterwards the outbox must hold exactly one row per
// (source change, pipe) (docs/ARCHITECTURE.md, invariants 1 and 2), compared with an
// independent `cdcout tail` of the same binlog range; the receiver, the
// file and the broker must have every change, redelivered only under the same id, in
// per-key order (invariant 5).
func TestCrashRecovery(t *testing.T) {
	inBothModes(t, testCrashRecovery)
}

// crashKills is how many SIGKILLs each mode gets.
const crashKills = 32

// killedOften is the configuration of a replica a test SIGKILLs again and
// again. Small enqueue batches and a short flush interval make many
// enqueue transactions, so kills land inside them; the lease TTL and
// claim lease are short so a restarted process takes over within seconds
// (a killed holder's enqueue lease and delivery claims must lapse).
const killedOften = `lease_ttl: 1s
claim_lease: 3s
http_addr: "off"
enqueue_batch_size: 16
enqueue_flush_interval: 10ms
enqueue_max_buffer: 40
`

// writerSource is Server.NewSource for a writer's load: a source database
// prefix… holding the tables a writer writes (a key, a number and a
// note), its state database prefix…_state, a connection, and the binlog
// position before the load.
func writerSource(t *testing.T, srv *mysqltest.Server, prefix string, tables ...string) (db *sql.DB, src, stateDB, from string) {
	t.Helper()
	src = srv.CreateDB(t, prefix)
	stateDB = srv.CreateDB(t, prefix+"_state")
	for _, tbl := range tables {
		srv.Exec(t, "CREATE TABLE `"+src+"`."+tbl+" (id INT PRIMARY KEY, v INT NOT NULL, note VARCHAR(32) NOT NULL)")
	}
	db = srv.Open(t)
	return db, src, stateDB, gtidPos(t, db)
}

// jitteryAnswer accepts every delivery after a small random latency (under
// fastMS milliseconds), in slowPercent of them a longer one (slowMS plus
// under spreadMS), so that kills land while deliveries are in flight.
func jitteryAnswer(slowPercent, slowMS, spreadMS, fastMS int) func(*envelope) (int, time.Duration) {
	return func(*envelope) (int, time.Duration) {
		if rand.IntN(100) < slowPercent {
			return 200, time.Duration(slowMS+rand.IntN(spreadMS)) * time.Millisecond
		}
		return 200, time.Duration(rand.IntN(fastMS)) * time.Millisecond
	}
}

// newModeReceiver is the receiver of a test that kills replicas, in
// change identity mode mode. The digest run delivers to a receiver of
// small capacity (listen backlog 5, 2 requests at a time, like Python's
// http.server), the gtid run to an unlimited one: kills and takeovers
// must not depend on a receiver that takes everything at once.
func newModeReceiver(t *testing.T, mode string, answer func(*envelope) (int, time.Duration)) *receiver {
	if mode == "digest" {
		return newSmallReceiver(t, 5, 2, answer)
	}
	return newReceiver(t, answer)
}

// load is a write load running in the background (startLoad).
type load struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	err    error
}

// startLoad runs run in a goroutine until stop cancels its context.
func startLoad(run func(context.Context) error) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		err := run(ctx)
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
	}()
	return l
}

// failed is the error the load ended with, nil while it runs.
func (l *load) failed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// stop cancels the load, waits for it to end and returns its error; it
// may be called again.
func (l *load) stop() error {
	l.cancel()
	<-l.done
	return l.failed()
}

// writer produces a steady load of inserts, updates and deletes on random
// keys of two tables, some in multi-row transactions, and counts the row
// changes it committed.
type writer struct {
	db      *sql.DB
	tables  []string
	keys    int
	changes atomic.Int64
	txs     atomic.Int64
	rows    []map[int]bool // per table: keys that exist
}

func (w *writer) run(ctx context.Context) error {
	w.rows = make([]map[int]bool, len(w.tables))
	for i := range w.rows {
		w.rows[i] = map[int]bool{}
	}
	for ctx.Err() == nil {
		n := 1
		switch r := rand.IntN(100); {
		case r < 2:
			n = 30 // bigger than enqueue_max_buffer's share: written mid transaction
		case r < 25:
			n = 2 + rand.IntN(4)
		}
		if err := w.tx(n); err != nil {
			return err
		}
		time.Sleep(time.Duration(8+rand.IntN(8)) * time.Millisecond)
	}
	return nil
}

// tx runs one transaction of n row operations. Its changes count only
// once COMMIT succeeded.
func (w *writer) tx(n int) error {
	ctx := context.Background()
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	overlay := make([]map[int]bool, len(w.rows))
	for i := range overlay {
		overlay[i] = map[int]bool{}
	}
	exists := func(ti, k int) bool {
		if v, ok := overlay[ti][k]; ok {
			return v
		}
		return w.rows[ti][k]
	}
	var affected int64
	for range n {
		ti, k := rand.IntN(len(w.tables)), 1+rand.IntN(w.keys)
		var q string
		switch {
		case !exists(ti, k):
			q = fmt.Sprintf("INSERT INTO %s (id, v, note) VALUES (%d, 0, 'n%d')", w.tables[ti], k, rand.IntN(1000))
			overlay[ti][k] = true
		case rand.IntN(10) < 7:
			q = fmt.Sprintf("UPDATE %s SET v = v + 1, note = 'u%d' WHERE id = %d", w.tables[ti], rand.IntN(1000), k)
		default:
			q = fmt.Sprintf("DELETE FROM %s WHERE id = %d", w.tables[ti], k)
			overlay[ti][k] = false
		}
		res, err := tx.ExecContext(ctx, q)
		if err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
		a, _ := res.RowsAffected()
		if a != 1 {
			return fmt.Errorf("%s affected %d rows, want 1", q, a)
		}
		affected += a
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	for ti := range overlay {
		for k, v := range overlay[ti] {
			w.rows[ti][k] = v
		}
	}
	w.changes.Add(affected)
	w.txs.Add(1)
	return nil
}

func testCrashRecovery(t *testing.T, mode string) {
	srv := mysqltest.Shared(t)
	db, src, stateDB, from := writerSource(t, srv, "e2e_crash_"+mode, "a", "b")
	start := time.Now()

	recv := newModeReceiver(t, mode, jitteryAnswer(3, 100, 200, 8))
	br := newCrashBroker(t, mode)
	dir := t.TempDir()
	outFile := filepath.Join(dir, "out.jsonl")
	cfgPath := filepath.Join(dir, "cdcout.yaml")
	cfg := fmt.Sprintf(`instance: crash
replica_id: e2e-crash
`+killedOften+`shutdown_timeout: 15s
sinks:
  - name: hook
    url: %s/hook
    timeout: 1s
    batch_size: 16
    concurrency: 4
  - name: file
    url: file://%s
    timeout: 2s
    batch_size: 32
    concurrency: 2
  - name: %s
    url: %s
    timeout: 2s
    batch_size: 16
    concurrency: 4
`, recv.srv.URL, outFile, br.name, br.url)
	args := runConfig(t, cfgPath, cfg, srv.DSN, stateDB, src, from, mode)
	log := newLogFile(t, "crash-"+mode)

	w := &writer{db: db, tables: []string{"`" + src + "`.a", "`" + src + "`.b"}, keys: 40}
	wr := startLoad(w.run)
	defer wr.stop()

	// blockEnqueue makes the next enqueue transaction wait at its
	// checkpoint write, after its claims and outbox rows are written, by
	// holding the checkpoint row's lock; it returns once a cdcout statement
	// waits for that lock (false after timeout) and a release func. A kill
	// then lands inside an enqueue transaction for certain.
	blockEnqueue := func(timeout time.Duration) (bool, func()) {
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec("SELECT position FROM `" + stateDB + "`.checkpoints WHERE source = 'enqueue/crash' FOR UPDATE"); err != nil {
			tx.Rollback()
			t.Fatalf("lock checkpoint: %v", err)
		}
		release := func() { tx.Rollback() }
		deadline := time.Now().Add(timeout)
		for time.Now().Before(deadline) {
			if n := runningStatements(t, db, "INSERT INTO", "checkpoints", stateDB); n > 0 {
				return true, release
			}
			time.Sleep(2 * time.Millisecond)
		}
		return false, release
	}

	var (
		kills, inEnqueue, afterDelivery int
		maxFirst                        time.Duration
		firstSeen                       int
	)
	noteFirst := func(p *proc) {
		if at, ok := recv.firstAfter(p.started); ok {
			firstSeen++
			maxFirst = max(maxFirst, at.Sub(p.started))
		}
	}
	for kills < crashKills {
		p := startCdcout(t, log, args...)
		switch kills % 3 {
		case 0:
			// Anywhere: starting up, waiting for the lease, draining.
			time.Sleep(time.Duration(50+rand.IntN(650)) * time.Millisecond)
		case 1:
			// During deliveries: after this process's first one.
			waitFor(t, 15*time.Second, func() (bool, string) {
				_, ok := recv.firstAfter(p.started)
				return ok || p.exited(), "no delivery after a restart"
			})
			afterDelivery++
			time.Sleep(time.Duration(50+rand.IntN(650)) * time.Millisecond)
		case 2:
			// Inside an enqueue transaction, its rows written and not
			// committed.
			time.Sleep(time.Duration(50+rand.IntN(650)) * time.Millisecond)
			blocked, release := blockEnqueue(5 * time.Second)
			if blocked {
				inEnqueue++
				time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
			}
			if p.exited() {
				t.Fatalf("cdcout exited on its own before kill %d: %v", kills+1, p.err)
			}
			p.kill()
			release()
		}
		if p.exited() && kills%3 != 2 {
			t.Fatalf("cdcout exited on its own before kill %d: %v", kills+1, p.err)
		}
		p.kill()
		kills++
		noteFirst(p)
		if err := wr.failed(); err != nil {
			t.Fatalf("writer: %v", err)
		}
		time.Sleep(time.Duration(50+rand.IntN(650)) * time.Millisecond)
	}

	// The last instance runs to the end: stop the load, let it drain
	// everything, stop it gracefully.
	last := startCdcout(t, log, args...)
	if err := wr.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	n := int(w.changes.Load())
	pipeTable := map[string]string{}
	for _, tbl := range []string{"a", "b"} {
		for _, sink := range []string{"hook", "file", br.name} {
			pipeTable["crash:"+src+"."+tbl+":"+sink] = tbl
		}
	}
	waitFor(t, 60*time.Second, func() (bool, string) {
		if last.exited() {
			t.Fatalf("the last cdcout exited on its own: %v", last.err)
		}
		recs, open, _, err := outboxCounts(db, stateDB)
		if err != nil {
			return false, err.Error()
		}
		return recs >= 3*n && open == 0, fmt.Sprintf("outbox has %d records (want %d), %d pending (claimed or not): %s", recs, 3*n, open, outboxSummary(db, stateDB))
	})
	noteFirst(last)
	if code := last.stop(20 * time.Second); code != 0 {
		t.Fatalf("cdcout exited with code %d after SIGTERM, want 0", code)
	}
	elapsed := time.Since(start)

	// The independent account of what was committed.
	want, wantByTable := tailCommitted(t, srv.DSN, src+".*", from, n)

	// Outbox: exactly one record per (change, pipe), all delivered.
	rows := readOutbox(t, db, stateDB)
	perPipe := map[string]map[change]int{}
	keys := map[string]bool{}
	ids := map[string]map[string]change{} // pipe → outbox id → change
	for _, r := range rows {
		if perPipe[r.pipe] == nil {
			perPipe[r.pipe] = map[change]int{}
			ids[r.pipe] = map[string]change{}
		}
		perPipe[r.pipe][r.env.change()]++
		ids[r.pipe][r.id] = r.env.change()
		if keys[r.pipe+" "+r.changeKey] {
			t.Errorf("outbox: change_key %s twice in pipe %s", r.changeKey, r.pipe)
		}
		keys[r.pipe+" "+r.changeKey] = true
		if r.status != "delivered" {
			t.Errorf("outbox record %s of %s is %s, want delivered", r.id, r.pipe, r.status)
		}
		if r.env.ID != r.id {
			t.Errorf("outbox record %s carries envelope id %s", r.id, r.env.ID)
		}
	}
	if got, want := len(perPipe), len(pipeTable); got != want {
		t.Errorf("outbox has %d pipes, want %d", got, want)
	}
	for pipe, tbl := range pipeTable {
		checkOncePerChange(t, pipe, wantByTable[tbl], perPipe[pipe])
	}

	// Receiver: every change, duplicates only under the same webhook-id,
	// per-key order.
	dels := recv.snapshot()
	recv.mu.Lock()
	bad := recv.bad
	recv.mu.Unlock()
	if len(bad) > 0 {
		t.Errorf("receiver got %d requests that are not envelopes, first: %s", len(bad), bad[0])
	}
	hookIDs := map[change]string{}
	var envs []envelope
	for _, d := range dels {
		if d.webhookID != d.env.ID {
			t.Errorf("webhook-id %q but body id %q", d.webhookID, d.env.ID)
		}
		c := d.env.change()
		if prev, ok := hookIDs[c]; ok && prev != d.webhookID {
			t.Errorf("change %v delivered under two webhook-ids: %s and %s", c, prev, d.webhookID)
		}
		hookIDs[c] = d.webhookID
		if oc, ok := ids["crash:"+src+"."+c.table+":hook"][d.webhookID]; !ok || oc != c {
			t.Errorf("delivery %s (%v) is not the outbox record of that change", d.webhookID, c)
		}
		envs = append(envs, d.env)
	}
	for _, e := range want {
		if _, ok := hookIDs[e.change()]; !ok {
			t.Errorf("receiver never got %v", e.change())
			break
		}
	}
	if got, want := len(hookIDs), n; got != want {
		t.Errorf("receiver got %d distinct changes, want %d", got, want)
	}
	for _, v := range orderViolations(envs) {
		t.Errorf("receiver per-key order: %s", v)
	}
	dupHTTP := len(dels) - len(hookIDs)

	// File and broker sinks: the same, from the JSON lines and the
	// broker's messages.
	fenvs, torn := readJSONL(t, outFile)
	dupFile := checkCopies(t, "file", fenvs, ids, "crash:"+src, n)
	benvs := br.read()
	dupBroker := checkCopies(t, br.name, benvs, ids, "crash:"+src, n)

	ops := map[string]int{}
	for _, e := range want {
		ops[e.Op]++
	}
	var opList []string
	for op, k := range ops {
		opList = append(opList, fmt.Sprintf("%s=%d", op, k))
	}
	sort.Strings(opList)
	t.Logf("mode %s: %d changes (%s) in %d transactions, %d outbox records; %d SIGKILLs (%d inside an enqueue transaction blocked at its checkpoint write, %d after the instance's first delivery); "+
		"duplicates delivered: %d over HTTP (of %d requests), %d in the file (%d torn lines), %d in %s (of %d messages); max restart→first delivery %s (%d instances delivered); %d enqueue lease takeovers logged; %s in all",
		mode, n, strings.Join(opList, " "), w.txs.Load(), len(rows), kills, inEnqueue, afterDelivery,
		dupHTTP, len(dels), dupFile, len(torn), dupBroker, br.name, len(benvs), maxFirst.Round(time.Millisecond), firstSeen,
		log.count("enqueue lease acquired"), elapsed.Round(time.Second))
}

// crashBroker is the message-broker sink a crash run delivers to besides
// the webhook and the file: Redis Streams in gtid mode, Pub/Sub in digest
// mode (one per run keeps its load at three sinks).
type crashBroker struct {
	name, url string
	read      func() []envelope // every message, in append order
}

func newCrashBroker(t *testing.T, mode string) crashBroker {
	if mode == "gtid" {
		rds := redistest.Start(t, redistest.Options{})
		return crashBroker{"redis", rds.URL("/crash.{table}"), func() []envelope { return readStreams(t, rds, "crash.a", "crash.b") }}
	}
	pst := startPubSub(t, "crash", "crash.a", "crash.b")
	return crashBroker{"pubsub", "pubsub://crash/crash.{table}", func() []envelope { return readPubSub(t, pst) }}
}

// checkCopies checks what a sink that keeps every copy it was given (a
// file, a stream) holds: every one of the n changes, a redelivery only
// under the same id, each copy the outbox record of its change (pipe
// pipePrefix.<table>:<sink>), per-key order. It returns the number of
// duplicates.
func checkCopies(t *testing.T, sinkName string, envs []envelope, ids map[string]map[string]change, pipePrefix string, n int) int {
	t.Helper()
	seen := map[change]string{}
	for _, e := range envs {
		c := e.change()
		if prev, ok := seen[c]; ok && prev != e.ID {
			t.Errorf("%s: change %v written under two ids: %s and %s", sinkName, c, prev, e.ID)
		}
		seen[c] = e.ID
		if oc, ok := ids[pipePrefix+"."+c.table+":"+sinkName][e.ID]; !ok || oc != c {
			t.Errorf("%s: copy %s (%v) is not the outbox record of that change", sinkName, e.ID, c)
		}
	}
	if got := len(seen); got != n {
		t.Errorf("%s sink has %d distinct changes, want %d", sinkName, got, n)
	}
	for _, v := range orderViolations(envs) {
		t.Errorf("%s per-key order: %s", sinkName, v)
	}
	return len(envs) - len(seen)
}

// runningStatements counts the server's sessions running a statement that
// starts with prefix and holds every one of parts. It reads SHOW FULL
// PROCESSLIST and matches the bytes here: MySQL's
// information_schema.processlist fails on a statement holding binary
// parameters ("Cannot convert string … to utf8mb3"), and cdcout's own
// statements do.
func runningStatements(t *testing.T, db *sql.DB, prefix string, parts ...string) int {
	t.Helper()
	n := 0
	for _, row := range mysqltest.QueryStrings(t, db, "SHOW FULL PROCESSLIST") {
		command, info := row[4], row[7]
		if command != "Query" && command != "Execute" || !strings.HasPrefix(info, prefix) {
			continue
		}
		all := true
		for _, p := range parts {
			all = all && strings.Contains(info, p)
		}
		if all {
			n++
		}
	}
	return n
}

// runConfig writes cfg (YAML) to path and returns the arguments of a
// `cdcout run` with it, capturing src.* from the position from in the
// given identity mode.
func runConfig(t testing.TB, path, cfg, dsn, stateDB, src, from, mode string) []string {
	t.Helper()
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"run", "--config", path, "--dsn", dsn, "--state-db", stateDB,
		"--tables", src + ".*", "--from", from, "--change-identity", mode, "--log-format", "json"}
}

// checkOncePerChange fails the test unless pipe's outbox records (got:
// how many records each change has) are exactly one per change of the
// source (exp), invariants 1 and 2: none missing, none of a change the
// source does not have, none twice. (With no change missing and none
// extra the two sets are equal, so their sizes are too.)
func checkOncePerChange(t *testing.T, pipe string, exp map[change]bool, got map[change]int) {
	t.Helper()
	missing, extra, dup := 0, 0, 0
	for c := range exp {
		if got[c] == 0 {
			missing++
		}
	}
	for c, k := range got {
		if !exp[c] {
			extra++
		}
		if k > 1 {
			dup++
		}
	}
	if missing+extra+dup > 0 {
		t.Errorf("pipe %s: outbox has %d changes, source %d: %d missing, %d extra, %d with more than one record",
			pipe, len(got), len(exp), missing, extra, dup)
	}
}

// tailCommitted is the independent account of what the writer committed:
// the n changes a plain `cdcout tail` of the tables reads from from
// (tailChanges), and the same by table. Another count than n, or a change
// printed twice, fails the test.
func tailCommitted(t *testing.T, dsn, tables, from string, n int) ([]envelope, map[string]map[change]bool) {
	t.Helper()
	tail := tailChanges(t, dsn, tables, from, n)
	if got := len(tail); got != n {
		t.Fatalf("tail read %d changes, the writer committed %d", got, n)
	}
	byTable := map[string]map[change]bool{}
	for _, e := range tail {
		if byTable[e.Source.Table] == nil {
			byTable[e.Source.Table] = map[change]bool{}
		}
		c := e.change()
		if byTable[e.Source.Table][c] {
			t.Fatalf("tail printed %v twice", c)
		}
		byTable[e.Source.Table][c] = true
	}
	return tail, byTable
}
