package e2e

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/faultproxy"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/outbox"
)

// TestFaults runs the real binary with its source, its state database and
// its webhook each behind a fault proxy (internal/faultproxy) and puts it
// through the faults of issue 14, scaled to seconds: the server killed,
// the binlog link blackholed (alone and with the state link), a storm of
// connection resets during multi-thousand-row transactions, the state
// database blackholed, killed (refusing), read-only and stripped of its
// write grants, one 10,000-row UPDATE statement, a 4 MiB BLOB inserted and
// updated, DDL under writes and while stopped, a hanging webhook and
// one answering 503 with Retry-After. A writer commits a sequence number
// per change (the ground truth); after each fault every committed change
// must reach the webhook, once in the outbox, in per-key commit order,
// redelivered only under its id. Each phase logs its numbers (the issue's
// table); /readyz must report the faults it can see within 10 s.
//
// Flavour notes: read_only and REVOKE behave alike on MariaDB and MySQL
// for a user without SUPER; the rest is plain SQL and TCP.
func TestFaults(t *testing.T) {
	r := newFaultRig(t, "fault")
	srv, src, stateDB, user := r.srv, r.src, r.stateDB, r.user
	r.start()
	r.waitConnected(r.addr)
	stop := r.startWriter()
	defer stop()
	r.settle("warm-up")

	srv.Exec(t, "SET GLOBAL read_only = OFF") // in case a phase fails midway
	phases := []faultPhase{
		{name: "server (source + state) killed 5 s", unready: true, hold: 5 * time.Second,
			fault: func() { r.pause(); srv.Kill() },
			heal: func() {
				if err := srv.StartAgain(); err != nil {
					t.Fatalf("restart server: %v", err)
				}
				r.resume()
			}},
		{name: "binlog link blackholed 8 s", unready: true, hold: 8 * time.Second,
			fault: r.srcProxy.Blackhole, heal: r.srcProxy.Heal},
		{name: "binlog + state links blackholed 8 s", unready: true, hold: 8 * time.Second,
			fault: func() { r.srcProxy.Blackhole(); r.stateProxy.Blackhole() },
			heal:  func() { r.srcProxy.Heal(); r.stateProxy.Heal() }},
		{name: "15 resets of source and state in 10 s, 3 × 3,000-row transactions", hold: 10 * time.Second,
			fault: func() { r.resetStorm(stormResets(), 10*time.Second, 3, 3000) }, heal: func() {}},
		{name: "one 10,000-row UPDATE statement (after 10,000 inserts)", hold: 2 * time.Second,
			fault: func() { r.hugeUpdate(10_000) }, heal: func() {}},
		{name: "a 4 MiB BLOB inserted and updated under writes", hold: 2 * time.Second,
			fault: func() { r.wideRow(4 << 20) }, heal: func() {}},
		{name: "state link blackholed 8 s", unready: true, hold: 8 * time.Second,
			fault: r.stateProxy.Blackhole, heal: r.stateProxy.Heal},
		{name: "state database killed (refusing) 5 s", unready: true, hold: 5 * time.Second,
			fault: func() { r.stateProxy.Refuse(); r.stateProxy.Reset() }, heal: r.stateProxy.Heal},
		{name: "state user's write grants revoked 6 s", unready: true, hold: 6 * time.Second,
			fault: func() { srv.Exec(t, "REVOKE INSERT, UPDATE, DELETE ON `"+stateDB+"`.* FROM '"+user+"'@'%'") },
			heal:  func() { srv.Exec(t, "GRANT INSERT, UPDATE, DELETE ON `"+stateDB+"`.* TO '"+user+"'@'%'") }},
		{name: "state database read-only 6 s", unready: true, hold: 6 * time.Second,
			fault: func() { srv.Exec(t, "SET GLOBAL read_only = ON") },
			heal:  func() { srv.Exec(t, "SET GLOBAL read_only = OFF") }},
		{name: "DDL under writes (ADD and DROP COLUMN)", hold: 3 * time.Second,
			fault: func() { srv.Exec(t, "ALTER TABLE `"+src+"`.t ADD COLUMN note VARCHAR(8) NOT NULL DEFAULT 'x'") },
			heal:  func() { srv.Exec(t, "ALTER TABLE `"+src+"`.t DROP COLUMN note") }},
		{name: "DDL while stopped", hold: 3 * time.Second,
			fault: func() {
				if code := r.p.stop(30 * time.Second); code != 0 {
					t.Fatalf("cdcout exit code %d after SIGTERM", code)
				}
				srv.Exec(t, "ALTER TABLE `"+src+"`.t ADD COLUMN extra INT NOT NULL DEFAULT 7")
			},
			heal: r.start},
		{name: "webhook hanging 8 s", hold: 8 * time.Second,
			fault: r.sinkProxy.Blackhole, heal: r.sinkProxy.Heal},
		{name: "webhook 503 with Retry-After: 2 for 6 s", hold: 6 * time.Second, retryAfter: 2 * time.Second,
			fault: func() { r.rcv.failing.Store(true) }, heal: func() { r.rcv.failing.Store(false) }},
	}
	var rows []string
	only := regexp.MustCompile(os.Getenv("CDCOUT_FAULT_PHASES")) // "" matches every phase
	for _, ph := range phases {
		if !only.MatchString(ph.name) {
			continue
		}
		rows = append(rows, r.run(ph))
		if t.Failed() {
			break
		}
	}
	t.Logf("issue 14 fault scenarios (scaled):\n| scenario | changes | lost | duplicate records | redeliveries | heal → resumed delivery | /readyz unready after |\n|---|---|---|---|---|---|---|\n%s",
		strings.Join(rows, "\n"))
	r.checkLogIsJSON()
}

// newFaultRig starts a server with a source table and a state user, a
// webhook receiver, proxies for the source, the state database and the
// webhook, and writes the binary's config (replica "f1", not started).
func newFaultRig(t *testing.T, name string) *faultRig {
	srv := mysqltest.Start(t, mysqltest.Options{})
	src := srv.CreateDB(t, "e2e_"+name)
	stateDB := srv.CreateDB(t, "e2e_"+name+"_state")
	srv.Exec(t, "CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY, v BIGINT NOT NULL)")
	user, pass := "cdc_fault", "fault-pass-3"
	srv.Exec(t, "CREATE USER '"+user+"'@'%' IDENTIFIED BY '"+pass+"'",
		"GRANT ALL PRIVILEGES ON `"+stateDB+"`.* TO '"+user+"'@'%'")
	r := &faultRig{t: t, srv: srv, src: src, stateDB: stateDB, user: user, pass: pass, committed: map[int][]int64{}}
	r.db = srv.Open(t)
	r.db.SetMaxOpenConns(4)
	r.rcv = newFaultReceiver(t)
	r.srcProxy, r.stateProxy = r.dbProxy(), r.dbProxy()
	r.sinkProxy = startProxy(t, strings.TrimPrefix(r.rcv.srv.URL, "http://"))
	r.addr = mysqltest.FreeAddr(t)
	r.cfgPath = t.TempDir() + "/cdcout.yaml"
	cfg := fmt.Sprintf(`instance: fault
lease_ttl: 3s
enqueue_flush_interval: 20ms
sinks:
  - name: hook
    url: http://%s/hook
    timeout: 3s
`, r.sinkProxy.Addr())
	if err := os.WriteFile(r.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r.log = newLogFile(t, name)
	r.args = r.replicaArgs("f1", r.srcProxy, r.stateProxy, r.addr)
	return r
}

func (r *faultRig) dbProxy() *faultproxy.Proxy {
	return startProxy(r.t, net.JoinHostPort(r.srv.Host, strconv.Itoa(r.srv.Port)))
}

// replicaArgs are `cdcout run`'s arguments for a replica reaching the
// source and the state database through the given proxies.
func (r *faultRig) replicaArgs(id string, src, st *faultproxy.Proxy, httpAddr string) []string {
	return []string{"run", "--config", r.cfgPath, "--dsn", proxiedDSN(r.t, r.srv.DSN, src, "", ""),
		"--state-dsn", proxiedDSN(r.t, r.srv.DSN, st, r.user, r.pass), "--state-db", r.stateDB,
		"--tables", r.src + ".t", "--from", "now", "--replica-id", id, "--http-addr", httpAddr, "--log-format", "json"}
}

// waitConnected waits until the replica at addr streams the binlog (a
// standby is ready too; with --from now, changes before the stream's
// start are not captured).
func (r *faultRig) waitConnected(addr string) {
	waitFor(r.t, 60*time.Second, func() (bool, string) {
		body := r.getAt(addr, "/v1/source")
		return strings.Contains(body, `"connected":true`), "stream not connected: " + body
	})
}

// startWriter starts the ground-truth writer; the returned stop waits for
// it and reports its error.
func (r *faultRig) startWriter() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.write(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			r.t.Errorf("writer: %v", err)
		}
	}
}

type faultPhase struct {
	name        string
	fault, heal func()
	hold        time.Duration
	unready     bool          // /readyz must report the fault
	retryAfter  time.Duration // the receiver asked to wait this long
}

// faultRig is the binary, its proxies, the receiver and the ground truth.
type faultRig struct {
	t                               *testing.T
	srv                             *mysqltest.Server
	src, stateDB, user, pass        string
	cfgPath                         string
	db                              *sql.DB
	srcProxy, stateProxy, sinkProxy *faultproxy.Proxy
	rcv                             *faultReceiver
	addr                            string
	args                            []string
	log                             *logFile
	p                               *proc

	writeMu   sync.Mutex // held: the writer is paused
	mu        sync.Mutex
	seq       int64
	committed map[int][]int64 // key → committed sequence numbers, in commit order
	changes   int
}

func startProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func proxiedDSN(t *testing.T, dsn string, p *faultproxy.Proxy, user, pass string) string {
	t.Helper()
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	mc.Net, mc.Addr = "tcp", p.Addr()
	if user != "" {
		mc.User, mc.Passwd = user, pass
	}
	return mc.FormatDSN()
}

func (r *faultRig) start() { r.p = startCdcout(r.t, r.log, r.args...) }

func (r *faultRig) pause()  { r.writeMu.Lock() }
func (r *faultRig) resume() { r.writeMu.Unlock() }

// write commits one change every ~10 ms: key seq%50 gets v = seq.
func (r *faultRig) write(ctx context.Context) error {
	for ctx.Err() == nil {
		r.writeMu.Lock()
		r.mu.Lock()
		r.seq++
		seq := r.seq
		r.mu.Unlock()
		key := int(seq % 50)
		_, err := r.db.Exec("INSERT INTO `"+r.src+"`.t (id, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE v = VALUES(v)", key, seq)
		if err == nil {
			r.record(key, seq)
		}
		r.writeMu.Unlock()
		if err != nil {
			return fmt.Errorf("change %d: %w", seq, err)
		}
		time.Sleep(time.Duration(8+rand.IntN(5)) * time.Millisecond)
	}
	return nil
}

func (r *faultRig) record(key int, seq int64) {
	r.mu.Lock()
	r.committed[key] = append(r.committed[key], seq)
	r.changes++
	r.mu.Unlock()
}

// bigTx commits one transaction of n changes, keys 1000…1000+n-1.
func (r *faultRig) bigTx(n int) error {
	tx, err := r.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	type kv struct {
		k int
		s int64
	}
	var all []kv
	for start := 0; start < n; start += 500 {
		var q strings.Builder
		var args []any
		q.WriteString("INSERT INTO `" + r.src + "`.t (id, v) VALUES ")
		for i := start; i < min(start+500, n); i++ {
			r.mu.Lock()
			r.seq++
			s := r.seq
			r.mu.Unlock()
			if i > start {
				q.WriteByte(',')
			}
			q.WriteString("(?, ?)")
			args = append(args, 1000+i, s)
			all = append(all, kv{1000 + i, s})
		}
		q.WriteString(" ON DUPLICATE KEY UPDATE v = VALUES(v)")
		if _, err := tx.Exec(q.String(), args...); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	for _, c := range all {
		r.record(c.k, c.s)
	}
	return nil
}

// hugeUpdate commits n inserted changes (bigTx) and then one UPDATE
// statement changing all n rows: one rows event sequence of n before and
// after images in one transaction.
func (r *faultRig) hugeUpdate(n int) {
	if err := r.bigTx(n); err != nil {
		r.t.Fatalf("insert %d rows: %v", n, err)
	}
	r.mu.Lock()
	base := r.seq + 1
	r.seq += int64(n)
	r.mu.Unlock()
	res, err := r.db.Exec("UPDATE `"+r.src+"`.t SET v = ? + (id - 1000) WHERE id BETWEEN 1000 AND ?", base, 1000+n-1)
	if err != nil {
		r.t.Fatalf("UPDATE of %d rows: %v", n, err)
	}
	if got, _ := res.RowsAffected(); got != int64(n) {
		r.t.Fatalf("UPDATE changed %d rows, want %d", got, n)
	}
	for i := range n {
		r.record(1000+i, base+int64(i))
	}
}

// wideRow adds a LONGBLOB column, inserts a row of key 999 with a value of
// n random bytes, updates it with another, and drops the column again: a
// record of 2n bytes before base64 passes between the writer's changes.
func (r *faultRig) wideRow(n int) {
	r.srv.Exec(r.t, "ALTER TABLE `"+r.src+"`.t ADD COLUMN data LONGBLOB NULL")
	for range 2 {
		v := make([]byte, n)
		_, _ = crand.Read(v)
		r.mu.Lock()
		r.seq++
		seq := r.seq
		r.mu.Unlock()
		if _, err := r.db.Exec("INSERT INTO `"+r.src+"`.t (id, v, data) VALUES (999, ?, ?) ON DUPLICATE KEY UPDATE v = VALUES(v), data = VALUES(data)", seq, v); err != nil {
			r.t.Fatalf("wide row: %v", err)
		}
		r.record(999, seq)
	}
	r.srv.Exec(r.t, "ALTER TABLE `"+r.src+"`.t DROP COLUMN data")
}

// resetStorm resets every proxied source and state connection resets
// times over d while txs transactions of rows changes each commit.
func (r *faultRig) resetStorm(resets int, d time.Duration, txs, rows int) {
	done := make(chan error, 1)
	go func() {
		var err error
		for range txs {
			if err = r.bigTx(rows); err != nil {
				break
			}
		}
		done <- err
	}()
	for range resets {
		time.Sleep(d / time.Duration(resets))
		r.srcProxy.Reset()
		r.stateProxy.Reset()
	}
	if err := <-done; err != nil {
		r.t.Fatalf("big transactions: %v", err)
	}
}

func (r *faultRig) getAt(addr, path string) string {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (r *faultRig) readyz() (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + r.addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func (r *faultRig) untilReadyz(want int, within time.Duration) time.Duration {
	r.t.Helper()
	start := time.Now()
	for {
		code, body := r.readyz()
		if code == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			r.t.Fatalf("/readyz = %d %q, want %d within %v\n%s", code, body, want, within, r.log.tail(30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settle waits until every committed change was delivered and checks the
// ground truth: nothing lost, each key's changes first delivered in commit
// order, one outbox record per change.
func (r *faultRig) settle(what string) {
	r.t.Helper()
	r.mu.Lock()
	committed := make(map[int][]int64, len(r.committed))
	for k, v := range r.committed {
		committed[k] = append([]int64(nil), v...)
	}
	r.mu.Unlock()
	covered := func() bool {
		delivered := r.rcv.byKey()
		for k, want := range committed {
			if len(delivered[k]) < len(want) {
				return false
			}
		}
		return true
	}
	// Generous: on a loaded 2-core machine the webhook behind its proxy
	// takes a few hundred changes a second, and the big phases write tens
	// of thousands.
	start := time.Now()
	waitFor(r.t, 150*time.Second, func() (bool, string) {
		if r.p.exited() {
			r.t.Fatalf("%s: cdcout exited: %v\n%s", what, r.p.err, r.log.tail(30))
		}
		if covered() {
			return true, ""
		}
		// The last polls say what the outbox holds for the first missing
		// change (reading every record: not on every poll).
		return false, fmt.Sprintf("%s: committed changes not delivered (missing: %s); outbox: %s", what,
			r.missing(time.Since(start) > 140*time.Second), outboxSummary(r.db, r.stateDB))
	})
	delivered := r.rcv.byKey()
	for k, want := range committed {
		got := delivered[k]
		if len(got) < len(want) || fmt.Sprint(got[:len(want)]) != fmt.Sprint(want) {
			r.t.Fatalf("%s: key %d delivered %v, committed %v (lost or out of order): %s",
				what, k, trim(got), trim(want), r.diagnose(got, want))
		}
	}
	// One record per change: no sequence number in two records.
	recs, err := outbox.ReadRecords(context.Background(), r.db, r.stateDB, "%")
	if err != nil {
		r.t.Fatal(err)
	}
	seen := make(map[int64]string, len(recs))
	for _, rec := range recs {
		v, err := afterV(rec.Payload)
		if err != nil {
			r.t.Fatalf("%s: record %s: %v", what, rec.ID, err)
		}
		if other, dup := seen[v]; dup {
			r.t.Fatalf("%s: change %d is in the outbox twice: records %s and %s", what, v, other, rec.ID)
		}
		seen[v] = rec.ID
	}
}

// diagnose says, for the first committed change of a key that is not
// where its commit order puts it among the key's first deliveries, whether
// it arrived at all (and where), and what the outbox holds for it.
func (r *faultRig) diagnose(got, want []int64) string {
	i := 0
	for i < len(want) && i < len(got) && got[i] == want[i] {
		i++
	}
	if i == len(want) {
		return "no difference"
	}
	v := want[i]
	at := slices.Index(got, v)
	out := fmt.Sprintf("change %d (the key's %d. commit) is first delivered at position %d of %d (-1: never)", v, i+1, at, len(got))
	return out + "; " + r.outboxHolds(v)
}

// outboxHolds says what the outbox holds for change v (the writer's
// sequence number): its records (status, segment), or none; how many
// claims have no records; and how many changes are in two records.
func (r *faultRig) outboxHolds(v int64) string {
	recs, err := outbox.ReadRecords(context.Background(), r.db, r.stateDB, "%")
	if err != nil {
		return "outbox: " + err.Error()
	}
	// One pass: a claim whose unit's first record is not in the outbox is a
	// change claimed and never written (the enqueue side lost it).
	ids := make(map[string]bool, len(recs))
	seen := make(map[int64]bool, len(recs))
	twice := 0
	var found []string
	for _, rec := range recs {
		ids[rec.ID] = true
		got, err := afterV(rec.Payload)
		if err != nil {
			continue
		}
		if seen[got] {
			twice++
		}
		seen[got] = true
		if got == v {
			found = append(found, fmt.Sprintf("record %s change key %s status %s segment %q (%s)", rec.ID, rec.ChangeKey, rec.Status, rec.InSegment, r.rcv.sawID(rec.ID)))
		}
	}
	out := fmt.Sprintf("%d records, %d changes in two records", len(recs), twice)
	var orphans []string
	rows, err := r.db.Query("SELECT change_key, COALESCE(outbox_id, '') FROM `" + r.stateDB + "`.claims")
	if err != nil {
		out += "; claims: " + err.Error()
	} else {
		for rows.Next() {
			var key, id string
			if rows.Scan(&key, &id) == nil && !ids[id] {
				orphans = append(orphans, key+"→"+id)
			}
		}
		rows.Close()
		out += fmt.Sprintf("; %d claims without their records %v", len(orphans), orphans[:min(len(orphans), 5)])
	}
	if len(found) == 0 {
		return out + fmt.Sprintf("; the outbox holds no record of change %d (never enqueued)", v)
	}
	return out + fmt.Sprintf("; for change %d the outbox holds ", v) + strings.Join(found, ", ")
}

// afterV is the writer's sequence number in a record: its after image's v.
func afterV(payload []byte) (int64, error) {
	var env struct {
		After struct {
			V int64 `json:"v"`
		} `json:"after"`
	}
	err := json.Unmarshal(payload, &env)
	return env.After.V, err
}

// missing describes committed changes not delivered (for failures), and
// with detail what the outbox holds for the first of them.
func (r *faultRig) missing(detail bool) string {
	delivered := map[int64]bool{}
	for _, vs := range r.rcv.byKey() {
		for _, v := range vs {
			delivered[v] = true
		}
	}
	var miss []int64
	r.mu.Lock()
	for _, vs := range r.committed {
		for _, v := range vs {
			if !delivered[v] {
				miss = append(miss, v)
			}
		}
	}
	r.mu.Unlock()
	slices.Sort(miss)
	out := fmt.Sprintf("%d changes, first %v", len(miss), miss[:min(len(miss), 10)])
	if detail && len(miss) > 0 {
		out += "; " + r.outboxHolds(miss[0])
	}
	return out
}

func trim(s []int64) []int64 {
	if len(s) > 12 {
		return s[len(s)-12:]
	}
	return s
}

// run applies one phase and returns its table row.
func (r *faultRig) run(ph faultPhase) string {
	r.t.Helper()
	r.mu.Lock()
	before := r.changes
	r.mu.Unlock()
	redelivered := r.rcv.redeliveries()
	start := time.Now()
	ph.fault()
	unready := time.Duration(-1)
	for time.Since(start) < ph.hold {
		if unready < 0 {
			if code, _ := r.readyz(); code != 200 {
				unready = time.Since(start)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	ph.heal()
	healed := time.Now()
	var resumed time.Duration
	waitFor(r.t, 90*time.Second, func() (bool, string) {
		at, ok := r.rcv.firstAfter(healed)
		resumed = at.Sub(healed)
		return ok, ph.name + ": no delivery since the heal; outbox: " + outboxSummary(r.db, r.stateDB)
	})
	r.settle(ph.name)
	r.untilReadyz(200, 30*time.Second)
	r.mu.Lock()
	changes := r.changes - before
	r.mu.Unlock()
	ready := "stayed ready"
	switch {
	case unready >= 0:
		ready = fmt.Sprintf("%.1f s", unready.Seconds())
	case ph.unready:
		r.t.Errorf("%s: /readyz never reported the fault", ph.name)
	}
	// The target is 3 s beyond a Retry-After; the bound here is loose for
	// a loaded CI box, and still catches a stall of a lease or a backoff.
	if limit := ph.retryAfter + 10*time.Second; resumed > limit {
		r.t.Errorf("%s: delivery resumed %v after the heal, want ≤ %v", ph.name, resumed, limit)
	}
	if ph.unready && unready > 10*time.Second {
		r.t.Errorf("%s: /readyz reported the fault after %v, want ≤ 10 s", ph.name, unready)
	}
	resume := fmt.Sprintf("%.2f s", resumed.Seconds())
	if ph.retryAfter > 0 {
		resume += fmt.Sprintf(" (Retry-After %v)", ph.retryAfter)
	}
	row := fmt.Sprintf("| %s | %d | 0 | 0 | %d | %s | %s |", ph.name, changes, r.rcv.redeliveries()-redelivered, resume, ready)
	r.t.Log(row)
	return row
}

// checkLogIsJSON: every line cdcout wrote is a JSON object (issue 14,
// defect 6: the MySQL driver's own lines went around the logger).
func (r *faultRig) checkLogIsJSON() {
	b, err := os.ReadFile(r.log.path)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if strings.HasPrefix(line, "==== ") {
			continue // the harness's own marker
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			r.t.Errorf("log line is not JSON: %.200s", line)
		}
	}
}

// faultReceiver is the webhook: it records each delivery (2xx answer) and
// answers 503 with Retry-After while failing.
type faultReceiver struct {
	srv        *httptest.Server
	failing    atomic.Bool
	retryAfter string

	mu      sync.Mutex
	byID    map[string]int
	firstV  map[string]int64 // id → v of its first delivery
	keys    map[int][]int64  // key → v of first deliveries, in arrival order
	arrived []time.Time      // successful requests' arrival times
	redeliv int
}

func newFaultReceiver(t *testing.T) *faultReceiver {
	f := &faultReceiver{byID: map[string]int{}, firstV: map[string]int64{}, keys: map[int][]int64{}, retryAfter: "2"}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if f.failing.Load() {
			w.Header().Set("Retry-After", f.retryAfter)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		var env struct {
			ID  string `json:"id"`
			Key struct {
				ID int `json:"id"`
			} `json:"key"`
			After struct {
				V int64 `json:"v"`
			} `json:"after"`
		}
		if err := json.Unmarshal(body, &env); err != nil || env.ID == "" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.byID[env.ID]++
		if f.byID[env.ID] == 1 {
			f.keys[env.Key.ID] = append(f.keys[env.Key.ID], env.After.V)
			f.firstV[env.ID] = env.After.V
		} else {
			f.redeliv++
		}
		f.arrived = append(f.arrived, time.Now())
		f.mu.Unlock()
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// sawID says how often the receiver got record id, and the change its
// first delivery carried.
func (f *faultReceiver) sawID(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byID[id] == 0 {
		return "the receiver never got its id"
	}
	return fmt.Sprintf("the receiver got its id %d times, first with change %d", f.byID[id], f.firstV[id])
}

func (f *faultReceiver) redeliveries() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.redeliv
}

func (f *faultReceiver) byKey() map[int][]int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[int][]int64, len(f.keys))
	for k, v := range f.keys {
		out[k] = append([]int64(nil), v...)
	}
	return out
}

func (f *faultReceiver) firstAfter(t time.Time) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, at := range f.arrived {
		if at.After(t) {
			return at, true
		}
	}
	return time.Time{}, false
}

// TestFaultsLeaderPartitioned runs two replicas, each reaching the
// database through proxies of its own, and partitions the enqueue leader
// (both its links blackholed) for longer than the lease TTL: the other
// replica must take over within about a TTL, the partitioned one must
// report unready, and after the heal its held writes must be fenced —
// nothing lost, nothing enqueued twice, every key in order.
func TestFaultsLeaderPartitioned(t *testing.T) {
	r := newFaultRig(t, "fault_part")
	r.start()
	r.waitConnected(r.addr)
	src2, st2 := r.dbProxy(), r.dbProxy()
	addr2 := mysqltest.FreeAddr(t)
	p2 := startCdcout(t, r.log, r.replicaArgs("f2", src2, st2, addr2)...)
	stop := r.startWriter()
	defer stop()
	r.settle("warm-up")

	var holder string
	if err := r.db.QueryRow("SELECT holder FROM `" + r.stateDB + "`.leases WHERE name = 'enqueue/fault'").Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(holder, "f1/") {
		t.Fatalf("enqueue lease held by %q, want f1 (started first)", holder)
	}
	start := time.Now()
	r.srcProxy.Blackhole()
	r.stateProxy.Blackhole()
	var takeover, unready time.Duration = -1, -1
	for time.Since(start) < 12*time.Second {
		if unready < 0 {
			if code, _ := r.readyz(); code != 200 {
				unready = time.Since(start)
			}
		}
		if takeover < 0 {
			var h string
			if err := r.db.QueryRow("SELECT holder FROM `" + r.stateDB + "`.leases WHERE name = 'enqueue/fault' AND expires_at > NOW(6)").Scan(&h); err == nil && strings.HasPrefix(h, "f2/") {
				takeover = time.Since(start)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if takeover < 0 {
		t.Fatalf("the standby did not take the enqueue lease during a 12 s partition of the leader\n%s", r.log.tail(40))
	}
	if unready < 0 || unready > 10*time.Second {
		t.Errorf("the partitioned leader's /readyz reported the fault after %v, want ≤ 10 s", unready)
	}
	// Delivery went on during the partition, through the new leader.
	if _, ok := r.rcv.firstAfter(start.Add(takeover)); !ok {
		t.Fatalf("nothing delivered after the takeover\n%s", r.log.tail(40))
	}
	r.srcProxy.Heal()
	r.stateProxy.Heal()
	r.settle("leader partitioned 12 s")
	if p2.exited() {
		t.Fatalf("the second replica exited: %v", p2.err)
	}
	r.mu.Lock()
	n := r.changes
	r.mu.Unlock()
	t.Logf("| leader partitioned 12 s (TTL 3 s), 2 replicas | %d | 0 | 0 | %d | takeover after %.1f s | %.1f s |",
		n, r.rcv.redeliveries(), takeover.Seconds(), unready.Seconds())
}

// stormResets is the reset storm's count of resets: 15, or more from
// CDCOUT_FAULT_STORM_RESETS (150 found races that 15 did not).
func stormResets() int {
	n, _ := strconv.Atoi(os.Getenv("CDCOUT_FAULT_STORM_RESETS"))
	return max(n, 15)
}
