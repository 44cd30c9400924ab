package engine

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/dedup"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/outbox"
)

func TestMain(m *testing.M) { mysqltest.RunMain(m) }

// receiver is an httptest webhook receiver that records deliveries.
type receiver struct {
	srv *httptest.Server

	mu    sync.Mutex
	byID  map[string]int // webhook-id → times received
	order []delivery     // first receipt of each id, in arrival order
	dups  int
}

type delivery struct {
	id   string
	key  string
	op   string
	v    float64
	body map[string]any
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{byID: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		id := req.Header.Get("webhook-id")
		var env map[string]any
		if err := json.Unmarshal(b, &env); err != nil || id == "" || env["id"] != id {
			t.Errorf("bad delivery: id %q body %s", id, b)
			w.WriteHeader(400)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.byID[id]++
		if r.byID[id] > 1 {
			r.dups++
			return
		}
		key, _ := json.Marshal(env["key"])
		d := delivery{id: id, key: string(key), op: env["op"].(string), body: env}
		img, _ := env["after"].(map[string]any)
		if img == nil {
			img, _ = env["before"].(map[string]any)
		}
		d.v, _ = img["v"].(float64)
		r.order = append(r.order, d)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.order)
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	wait.Until(t, what, d, cond)
}

// runEngine starts an engine and returns a stop function that cancels it
// and checks that Run returned nil.
// records returns every record enqueued for the pipes LIKE pipeLike,
// outbox rows and segment records alike, each once.
func records(t *testing.T, db *sql.DB, stateDB, pipeLike string) []outbox.StoredRecord {
	t.Helper()
	recs, err := outbox.ReadRecords(context.Background(), db, stateDB, pipeLike)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// countRecords returns how many records recs holds and how many distinct
// change keys they carry.
func countRecords(recs []outbox.StoredRecord) (n, keys int) {
	seen := map[string]bool{}
	for _, r := range recs {
		seen[r.ChangeKey] = true
	}
	return len(recs), len(seen)
}

func runEngine(t *testing.T, cfg *config.Config, logger *zap.Logger) func() {
	t.Helper()
	_, stop := runEngineE(t, cfg, logger)
	return stop
}

// runEngineE runs an engine until the returned stop (or the test's end);
// prepare, when given, adjusts it before it runs.
func runEngineE(t *testing.T, cfg *config.Config, logger *zap.Logger, prepare ...func(*Engine)) (*Engine, func()) {
	t.Helper()
	e, err := New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range prepare {
		p(e)
	}
	return e, wait.Background(t, 30*time.Second, e.Run)
}

// TestEndToEnd writes inserts, updates and deletes in multi-row
// transactions while the engine is stopped and started again mid-stream,
// and checks that every change reaches the outbox exactly once per sink,
// and the webhook receiver and the file in per-key commit order.
func TestEndToEnd(t *testing.T) {
	inBothModes(t, testEndToEnd)
}

func testEndToEnd(t *testing.T, mode string) {
	srv := mysqltest.Shared(t)
	src := srv.CreateDB(t, "e2e_src")
	stateDB := srv.CreateDB(t, "e2e_state")
	other := srv.CreateDB(t, "e2e_other")
	srv.Exec(t,
		"CREATE TABLE `"+src+"`.items (id INT PRIMARY KEY, v INT NOT NULL, secret VARCHAR(20))",
		"CREATE TABLE `"+other+"`.noise (id INT PRIMARY KEY)",
	)
	db := srv.Open(t)
	from := mysqltest.GTIDPos(t, db)
	if from == "" {
		from = "now"
	}

	rcv := newReceiver(t)
	outFile := filepath.Join(t.TempDir(), "out.jsonl")
	cfg := config.Default()
	cfg.DSN = config.DSN(srv.DSN)
	cfg.StateDB = stateDB
	cfg.Instance = "t" + strings.ReplaceAll(stateDB, "_", "")[len("e2estate"):]
	cfg.ReplicaID = "r1"
	cfg.From = from
	cfg.ChangeIdentity = mode
	cfg.Tables = []string{src + ".*", other + ".*"}
	cfg.HTTPAddr = "off"
	cfg.EnqueueBatchSize = 50
	cfg.EnqueueMaxBuffer = 120 // below the largest transaction: exercises mid-transaction writes
	cfg.ShutdownTimeout = 10 * time.Second
	cfg.Sinks = []config.Sink{
		{Name: "hook", URL: rcv.srv.URL + "/hook", Tables: config.TableFilter{Include: []string{src + ".*"}}, DropColumns: []string{"secret"}, Secret: "whsec_aGVsbG8="},
		{Name: "file", URL: "file://" + outFile, Tables: config.TableFilter{Include: []string{src + ".items"}}, Ops: []string{"insert", "update", "delete"}},
	}
	cfg, err := reresolve(cfg)
	if err != nil {
		t.Fatal(err)
	}
	logger := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))

	const n = 300
	// The workload, in commit order; expected[id] is the per-key sequence.
	expected := map[int][]string{}
	var workload [][]string
	for start := 1; start <= n; start += 150 {
		var tx []string
		for id := start; id < start+150; id++ {
			tx = append(tx, fmt.Sprintf("INSERT INTO `%s`.items VALUES (%d, 0, 'pw%d')", src, id, id))
			expected[id] = append(expected[id], "c0")
		}
		workload = append(workload, tx)
	}
	for round := 1; round <= 2; round++ {
		for start := 1; start <= n; start += 40 {
			var tx []string
			for id := start; id < start+40 && id <= n; id++ {
				tx = append(tx, fmt.Sprintf("UPDATE `%s`.items SET v = %d WHERE id = %d", src, round, id))
				expected[id] = append(expected[id], fmt.Sprintf("u%d", round))
			}
			tx = append(tx, fmt.Sprintf("INSERT INTO `%s`.noise VALUES (%d)", other, round*1000+start))
			workload = append(workload, tx)
		}
	}
	var del []string
	for id := 3; id <= n; id += 3 {
		del = append(del, fmt.Sprintf("DELETE FROM `%s`.items WHERE id = %d", src, id))
		expected[id] = append(expected[id], "d2")
	}
	workload = append(workload, del)
	total := 0
	for _, seq := range expected {
		total += len(seq)
	}

	exec := func(txs [][]string) {
		for _, stmts := range txs {
			mysqltest.ExecTx(t, db, stmts...)
		}
	}

	e1, stop := runEngineE(t, cfg, logger)
	exec(workload[:3])
	waitFor(t, "first deliveries", 60*time.Second, func() bool { return rcv.count() > 0 })
	// Restart mid-stream: writes go on while the engine is stopped and
	// while the next one starts.
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		exec(workload[3:8])
	}()
	stop()
	// Memory is bounded by the buffer ceiling, even for the 150-row
	// transactions: plus, in GTID mode, the rest of a claim block
	// (dedup.GTIDBlock changes) per sink, since a transaction is written
	// in parts only between blocks.
	if got, limit := e1.Stats().MaxBuffered, cfg.EnqueueMaxBuffer+dedup.GTIDBlock*len(cfg.Sinks); got > limit || got == 0 {
		t.Errorf("peak buffered rows = %d, want 1..%d", got, limit)
	}
	runEngine(t, cfg, logger) // stopped by the test's cleanup
	<-writerDone
	exec(workload[8:])
	waitFor(t, "every change at the receiver", 90*time.Second, func() bool { return rcv.count() >= total })

	// Outbox: exactly one record per (change, pipe).
	state, err := sql.Open("mysql", srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	for _, sinkName := range []string{"hook", "file"} {
		pipe := cfg.Instance + ":" + src + ".items:" + sinkName
		if n, keys := countRecords(records(t, state, stateDB, pipe)); n != total || keys != total {
			t.Errorf("pipe %s: %d outbox records, %d distinct change keys; want %d of each", pipe, n, keys, total)
		}
	}
	var foreign int
	for _, r := range records(t, state, stateDB, "%") {
		if !strings.HasPrefix(r.Pipe, cfg.Instance+":"+src+".items:") {
			foreign++
		}
	}
	if foreign != 0 {
		t.Errorf("%d outbox records for other tables (state database or unsubscribed tables captured)", foreign)
	}

	// Receiver: every change once (redeliveries only with the same
	// webhook-id), per-key commit order, masked column absent.
	rcv.mu.Lock()
	got := map[string][]string{}
	for _, d := range rcv.order {
		got[d.key] = append(got[d.key], fmt.Sprintf("%s%d", d.op, int(d.v)))
		for _, img := range []string{"after", "before"} {
			if m, ok := d.body[img].(map[string]any); ok {
				if _, leaked := m["secret"]; leaked {
					t.Errorf("dropped column secret delivered in %s of %s", img, d.id)
				}
			}
		}
	}
	dups := rcv.dups
	rcv.mu.Unlock()
	t.Logf("%s: %d changes, %d redeliveries (same webhook-id)", mode, total, dups)
	for id, want := range expected {
		key := fmt.Sprintf(`{"id":%d}`, id)
		if g, w := strings.Join(got[key], ","), strings.Join(want, ","); g != w {
			t.Errorf("key %s: received %s, want %s", key, g, w)
		}
	}

	// File sink: every change (the file keeps the secret column: the drop
	// is per sink), per-key order.
	waitFor(t, "every change in the file", 30*time.Second, func() bool {
		b, _ := os.ReadFile(outFile)
		if strings.Count(string(b), "\n") >= total {
			return true
		}
		for _, tbl := range []string{"outbox", "segments"} {
			rows, err := state.Query("SELECT pipe, status, COUNT(*), CONCAT(MAX(claimer), ' ', MAX(next_attempt_at), ' ', NOW(6)) FROM `" + stateDB + "`." + tbl + " GROUP BY pipe, status")
			if err != nil {
				continue
			}
			for rows.Next() {
				var p, st string
				var n int
				var le sql.NullString
				rows.Scan(&p, &st, &n, &le)
				t.Logf("%s: %s %s %d %s", tbl, p, st, n, le.String)
			}
			rows.Close()
		}
		return false
	})
	b, _ := os.ReadFile(outFile)
	seen := map[string]bool{}
	fileGot := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var env struct {
			ID     string          `json:"id"`
			Op     string          `json:"op"`
			Key    json.RawMessage `json:"key"`
			After  map[string]any  `json:"after"`
			Before map[string]any  `json:"before"`
		}
		if err := json.Unmarshal([]byte(line), &env); err != nil {
			t.Fatalf("file line %q: %v", line, err)
		}
		if seen[env.ID] {
			continue
		}
		seen[env.ID] = true
		img := env.After
		if img == nil {
			img = env.Before
		}
		if _, ok := img["secret"]; !ok {
			t.Errorf("file sink lost the secret column it does not drop: %s", line)
		}
		v, _ := img["v"].(float64)
		fileGot[string(env.Key)] = append(fileGot[string(env.Key)], fmt.Sprintf("%s%d", env.Op, int(v)))
	}
	for id, want := range expected {
		key := fmt.Sprintf(`{"id":%d}`, id)
		if g, w := strings.Join(fileGot[key], ","), strings.Join(want, ","); g != w {
			t.Errorf("file key %s: %s, want %s", key, g, w)
		}
	}
}

// reresolve fills sink defaults the way Resolve does for a hand-built
// Config.
func reresolve(c *config.Config) (*config.Config, error) {
	c.FillSinkDefaults()
	return c, c.Validate()
}

// source is a source database with a table t, a state database, and a
// config of an instance that reads the source from its current position.
type source struct {
	srv          *mysqltest.Server
	db           *sql.DB
	src, stateDB string
	cfg          *config.Config
}

// newSource creates t with the given columns; mod (may be nil) completes the
// config (sinks above all) before it is validated.
func newSource(tb testing.TB, instance, columns string, mod func(*config.Config)) source {
	tb.Helper()
	return newSourceOn(tb, mysqltest.Shared(tb), instance, columns, mod)
}

// newSourceOn is newSource on a given server.
func newSourceOn(tb testing.TB, srv *mysqltest.Server, instance, columns string, mod func(*config.Config)) source {
	tb.Helper()
	s := source{srv: srv}
	s.src = s.srv.CreateDB(tb, instance+"_src")
	s.stateDB = s.srv.CreateDB(tb, instance+"_state")
	s.srv.Exec(tb, "CREATE TABLE `"+s.src+"`.t ("+columns+")")
	s.db = s.srv.Open(tb)
	from := mysqltest.GTIDPos(tb, s.db)
	s.cfg = config.Default()
	s.cfg.DSN = config.DSN(s.srv.DSN)
	s.cfg.StateDB = s.stateDB
	s.cfg.Instance = instance
	s.cfg.ReplicaID = "r1"
	s.cfg.From = from
	s.cfg.Tables = []string{s.src + ".*"}
	s.cfg.HTTPAddr = "off"
	if mod != nil {
		mod(s.cfg)
	}
	if _, err := reresolve(s.cfg); err != nil {
		tb.Fatal(err)
	}
	return s
}

// hooked is a source (t: id INT PRIMARY KEY, v INT) delivered to a webhook
// receiver in the given identity mode.
type hooked struct {
	source
	rcv *receiver
}

func newHooked(t *testing.T, instance, mode string, mod func(*config.Config)) hooked {
	t.Helper()
	rcv := newReceiver(t)
	s := newSource(t, instance, "id INT PRIMARY KEY, v INT", func(cfg *config.Config) {
		cfg.ChangeIdentity = mode
		cfg.Sinks = []config.Sink{{Name: "hook", URL: rcv.srv.URL}}
		if mod != nil {
			mod(cfg)
		}
	})
	return hooked{source: s, rcv: rcv}
}

// TestLeaseStolen takes the enqueue lease away from a running engine (as a
// replica with a higher epoch would): the engine must stop writing under its
// old epoch, wait for the lease, and carry on from its checkpoint with
// nothing lost or duplicated.
func TestLeaseStolen(t *testing.T) {
	h := newHooked(t, "steal", "gtid", func(cfg *config.Config) { cfg.LeaseTTL = 2 * time.Second })
	src, stateDB, db, rcv, cfg := h.src, h.stateDB, h.db, h.rcv, h.cfg
	runEngine(t, cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))

	insert := func(from, to int) {
		for id := from; id < to; id++ {
			if _, err := db.Exec(fmt.Sprintf("INSERT INTO `%s`.t VALUES (%d, %d)", src, id, id)); err != nil {
				t.Fatal(err)
			}
		}
	}
	insert(0, 20)
	waitFor(t, "first rows", 30*time.Second, func() bool { return rcv.count() >= 20 })

	leaseTable := "`" + stateDB + "`.leases"
	var epoch uint64
	if err := db.QueryRow("SELECT epoch FROM " + leaseTable + " WHERE name = 'enqueue/steal'").Scan(&epoch); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE " + leaseTable + " SET holder = 'intruder/1', epoch = epoch + 1, expires_at = NOW(6) + INTERVAL 3 SECOND WHERE name = 'enqueue/steal'"); err != nil {
		t.Fatal(err)
	}
	insert(20, 60)
	waitFor(t, "rows after the takeover", 60*time.Second, func() bool { return rcv.count() >= 60 })

	var holder string
	var epochNow uint64
	if err := db.QueryRow("SELECT holder, epoch FROM "+leaseTable+" WHERE name = 'enqueue/steal'").Scan(&holder, &epochNow); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(holder, "r1/") || epochNow <= epoch+1 {
		t.Errorf("lease after takeover: holder %q epoch %d; want r1/… with epoch > %d", holder, epochNow, epoch+1)
	}
	if n, keys := countRecords(records(t, db, stateDB, "%")); n != 60 || keys != 60 {
		t.Errorf("outbox: %d records, %d keys; want 60 of each", n, keys)
	}
	var cpEpoch uint64
	if err := db.QueryRow("SELECT epoch FROM `" + stateDB + "`.checkpoints WHERE source = 'enqueue/steal'").Scan(&cpEpoch); err != nil {
		t.Fatal(err)
	}
	if cpEpoch != epochNow {
		t.Errorf("checkpoint written under epoch %d, want the current %d", cpEpoch, epochNow)
	}
}

// TestInspectAddressInUse: a replica whose inspect address is taken stops
// with that error instead of running blind.
func TestInspectAddressInUse(t *testing.T) {
	srv := mysqltest.Shared(t)
	stateDB := srv.CreateDB(t, "busy_state")
	ln := httptest.NewServer(http.NotFoundHandler())
	defer ln.Close()
	addr := strings.TrimPrefix(ln.URL, "http://")
	err := runToError(t, srv, stateDB, "busy", addr)
	if err == nil || !strings.Contains(err.Error(), "listen on "+addr) {
		t.Fatalf("Run = %v, want a listen error", err)
	}
}

// runToError runs an engine with one stdout sink that must fail on its
// own, and returns Run's error.
func runToError(t *testing.T, srv *mysqltest.Server, stateDB, instance, httpAddr string) error {
	t.Helper()
	cfg := config.Default()
	cfg.DSN = config.DSN(srv.DSN)
	cfg.StateDB = stateDB
	cfg.Instance = instance
	cfg.HTTPAddr = httpAddr
	cfg.Sinks = []config.Sink{{URL: "stdout:"}}
	if _, err := reresolve(cfg); err != nil {
		t.Fatal(err)
	}
	e, err := New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), WithStdout(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return e.Run(ctx)
}

// TestGracefulStopWritesLastTransaction: with a flush interval that never
// fires, the rows of a committed transaction are only buffered; a stop must
// write them with their checkpoint before Run returns nil.
func TestGracefulStopWritesLastTransaction(t *testing.T) {
	srv := mysqltest.Shared(t)
	src := srv.CreateDB(t, "stop_src")
	stateDB := srv.CreateDB(t, "stop_state")
	srv.Exec(t, "CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY)")
	cfg := config.Default()
	cfg.DSN = config.DSN(srv.DSN)
	cfg.StateDB = stateDB
	cfg.Instance = "stop"
	cfg.HTTPAddr = "off"
	cfg.EnqueueFlushInterval = time.Hour
	cfg.EnqueueBatchSize = 1_000_000
	cfg.EnqueueMaxBuffer = 1_000_000
	cfg.Sinks = []config.Sink{{URL: "file://" + filepath.Join(t.TempDir(), "o.jsonl"), Tables: config.TableFilter{Include: []string{src + ".*"}}}}
	if _, err := reresolve(cfg); err != nil {
		t.Fatal(err)
	}
	e, stop := runEngineE(t, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	waitFor(t, "engine streaming", 30*time.Second, func() bool { return e.sourceStatus().Connected })

	conn, err := srv.Open(t).Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "INSERT INTO `"+src+"`.t VALUES (1),(2),(3),(4),(5)"); err != nil {
		t.Fatal(err)
	}
	gtid := srv.LastGTID(t, conn)
	waitFor(t, "rows buffered", 30*time.Second, func() bool { st := e.Stats(); return st.Buffered == 5 && st.Unwritten })
	stop()

	db := srv.Open(t)
	if n := len(records(t, db, stateDB, "%")); n != 5 {
		t.Errorf("outbox records after stop = %d, want 5", n)
	}
	var pos string
	if err := db.QueryRow("SELECT position FROM `" + stateDB + "`.checkpoints WHERE source = 'enqueue/stop'").Scan(&pos); err != nil {
		t.Fatalf("no checkpoint after stop: %v", err)
	}
	var p struct {
		GTIDSet string `json:"gtid_set"`
	}
	if err := json.Unmarshal([]byte(pos), &p); err != nil {
		t.Fatal(err)
	}
	if ok, err := mysqltest.GTIDSetContains(srv.Flavor, p.GTIDSet, gtid); err != nil || !ok {
		t.Errorf("checkpoint %s does not cover the last transaction %s", p.GTIDSet, gtid)
	}
}

// TestSinkFailureAndRecovery: the receiver answers 500s and times out for a
// while, then recovers; everything arrives in per-key order. A 400 for one
// change dead-letters that row only (later changes of its key still
// arrive), and retrying the dead letter delivers it.
func TestSinkFailureAndRecovery(t *testing.T) {
	srv := mysqltest.Shared(t)
	db, src, stateDB, from := srv.NewSource(t, "fail", "id INT PRIMARY KEY, v INT")

	var (
		mu       sync.Mutex
		requests int
		poison   = true // reject key 7's first version with a 400
		got      = map[int][]int{}
		seen     = map[string]bool{}
	)
	const failFirst = 40
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var env struct {
			Key   struct{ ID int }
			After *struct{ V int }
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &env)
		mu.Lock()
		requests++
		n := requests
		bad := poison && env.Key.ID == 7 && env.After != nil && env.After.V == 0
		mu.Unlock()
		switch {
		case n <= failFirst && n%4 == 0:
			time.Sleep(700 * time.Millisecond) // past the sink's 300ms timeout
			return
		case n <= failFirst:
			w.WriteHeader(http.StatusInternalServerError)
			return
		case bad:
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, "v must not be 0")
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if id := r.Header.Get("webhook-id"); !seen[id] {
			seen[id] = true
			v := -1
			if env.After != nil {
				v = env.After.V
			}
			got[env.Key.ID] = append(got[env.Key.ID], v)
		}
	}))
	defer hook.Close()

	cfg := config.Default()
	cfg.DSN = config.DSN(srv.DSN)
	cfg.StateDB = stateDB
	cfg.Instance = "fail"
	cfg.From = from
	cfg.HTTPAddr = "off"
	cfg.Sinks = []config.Sink{{Name: "hook", URL: hook.URL, Timeout: 300 * time.Millisecond, MaxAttempts: 20, Tables: config.TableFilter{Include: []string{src + ".*"}}}}
	if _, err := reresolve(cfg); err != nil {
		t.Fatal(err)
	}
	runEngine(t, cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)))

	// Per key: insert v=0, update v=1, update v=2, delete (-1).
	want := map[int][]int{}
	for round, stmt := range []string{"INSERT INTO `%s`.t VALUES (%d, 0)", "UPDATE `%s`.t SET v = 1 WHERE id = %d", "UPDATE `%s`.t SET v = 2 WHERE id = %d", "DELETE FROM `%s`.t WHERE id = %d"} {
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for id := 1; id <= 10; id++ {
			if _, err := tx.Exec(fmt.Sprintf(stmt, src, id)); err != nil {
				t.Fatal(err)
			}
			v := []int{0, 1, 2, -1}[round]
			if id == 7 && round == 0 {
				continue // dead-lettered until retried
			}
			want[id] = append(want[id], v)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	deliveredAll := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id, w := range want {
			if len(got[id]) < len(w) {
				return false
			}
		}
		return true
	}
	waitFor(t, "every change but the poisoned one", 60*time.Second, deliveredAll)
	mu.Lock()
	for id, w := range want {
		if g := fmt.Sprint(got[id]); g != fmt.Sprint(w) {
			t.Errorf("key %d: received %s, want %s", id, g, fmt.Sprint(w))
		}
	}
	mu.Unlock()

	var dead int
	var lastErr string
	if err := db.QueryRow("SELECT COUNT(*), IFNULL(MAX(last_error), '') FROM `"+stateDB+"`.outbox WHERE status = 'dead'").Scan(&dead, &lastErr); err != nil {
		t.Fatal(err)
	}
	if dead != 1 || !strings.Contains(lastErr, "400") || !strings.Contains(lastErr, "v must not be 0") {
		t.Fatalf("dead rows = %d (last error %q), want the one 400", dead, lastErr)
	}

	mu.Lock()
	poison = false
	mu.Unlock()
	if n, err := outbox.NewStore(db, stateDB, nil).RetryDead(context.Background(), "", ""); err != nil || n != 1 {
		t.Fatalf("RetryDead = %d, %v; want 1", n, err)
	}
	waitFor(t, "the retried dead letter", 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got[7]) == 4
	})
}

// TestRunRefusesServerWithoutBinlog: against a server with the binary log
// off, Run fails with the fix in the message and leaves no state database
// behind (by default it would live on that very server).
func TestRunRefusesServerWithoutBinlog(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{Args: []string{"--skip-log-bin"}})
	const stateDB = "cdcout_nobinlog_state"
	err := runToError(t, srv, stateDB, "nobinlog", "off")
	if !errors.Is(err, binlog.ErrServerNotReady) || !strings.Contains(err.Error(), "binary log is off") {
		t.Fatalf("Run = %v, want the binary log reported off", err)
	}
	var n int
	if err := srv.Open(t).QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", stateDB).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("state database %s was created on a server cdcout cannot read", stateDB)
	}
}

// TestXAAcrossRestart: an XA transaction prepared while the engine runs and
// committed after it restarted is delivered exactly once, after the
// transactions committed in between; those are not delivered twice
// although the engine re-read them from the checkpoint it kept before the
// PREPARE, and a rolled-back one is never delivered. Both identity modes.
func TestXAAcrossRestart(t *testing.T) {
	inBothModes(t, func(t *testing.T, mode string) {
		h := newHooked(t, "xa"+mode, mode, nil)
		srv, stateDB, db, rcv, cfg := h.srv, h.stateDB, h.db, h.rcv, h.cfg
		tbl := "`" + h.src + "`.t"
		logger := zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel))

		xa, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer xa.Close()
		// The keys delivered, sorted: different keys may arrive in any
		// order.
		ids := func() string {
			rcv.mu.Lock()
			defer rcv.mu.Unlock()
			var out []string
			for _, d := range rcv.order {
				out = append(out, d.key)
			}
			sort.Strings(out)
			return strings.Join(out, " ")
		}

		stop := runEngine(t, cfg, logger)
		srv.Exec(t, "INSERT INTO "+tbl+" VALUES (1, 1)")
		mysqltest.ConnExec(t, xa, "XA START 'a'", "INSERT INTO "+tbl+" VALUES (2, 2)", "XA END 'a'", "XA PREPARE 'a'")
		srv.Exec(t, "INSERT INTO "+tbl+" VALUES (3, 3)")
		waitFor(t, "rows 1 and 3", 30*time.Second, func() bool { return rcv.count() >= 2 })
		if got, want := ids(), `{"id":1} {"id":3}`; got != want {
			t.Fatalf("while 'a' is prepared: delivered %s, want %s", got, want)
		}
		stop()

		mysqltest.ConnExec(t, xa, "XA COMMIT 'a'", "XA START 'b'", "INSERT INTO "+tbl+" VALUES (4, 4)", "XA END 'b'", "XA PREPARE 'b'", "XA ROLLBACK 'b'")
		srv.Exec(t, "INSERT INTO "+tbl+" VALUES (5, 5)")
		runEngine(t, cfg, logger)
		waitFor(t, "rows 2 and 5", 30*time.Second, func() bool { return rcv.count() >= 4 })
		// A late duplicate would show as a fifth distinct delivery.
		time.Sleep(300 * time.Millisecond)
		if got, want := ids(), `{"id":1} {"id":2} {"id":3} {"id":5}`; got != want {
			t.Fatalf("delivered %s, want %s", got, want)
		}
		if n := len(records(t, db, stateDB, "%")); n != 4 {
			t.Fatalf("outbox holds %d records, want 4 (one per committed change)", n)
		}
	})
}

// TestLeastPrivilegeUser runs the engine as the least-privilege user the
// README gives (its GRANT statements, read from README.md, for this
// flavour): every start-up check runs without a warning that it could not,
// the state database is created and migrated, and changes are delivered.
func TestLeastPrivilegeUser(t *testing.T) {
	h := newHooked(t, "lpriv", "gtid", nil)
	user := fmt.Sprintf("lp_%d", os.Getpid())
	const password = "Least-Priv-pw1"
	h.srv.Exec(t, "CREATE USER '"+user+"'@'%' IDENTIFIED BY '"+password+"'")
	t.Cleanup(func() { h.srv.Exec(t, "DROP USER '"+user+"'@'%'") })
	grants := readmeGrants(t, h.srv.Flavor)
	for _, g := range grants {
		g = strings.ReplaceAll(g, "'cdcout'@'%'", "'"+user+"'@'%'")
		g = strings.ReplaceAll(g, "cdcout.*", "`"+h.stateDB+"`.*")
		h.srv.Exec(t, g)
	}
	dsn, err := mysql.ParseDSN(h.srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	dsn.User, dsn.Passwd = user, password
	h.cfg.DSN = config.DSN(dsn.FormatDSN())
	core, logs := observer.New(zap.WarnLevel)
	runEngine(t, h.cfg, zap.New(core))
	h.srv.Exec(t, "INSERT INTO `"+h.src+"`.t VALUES (1, 1), (2, 2), (3, 3)")
	waitFor(t, "3 deliveries", 30*time.Second, func() bool { return h.rcv.count() >= 3 })
	for _, e := range logs.All() {
		m := strings.ToLower(e.Message)
		if strings.Contains(m, "skipping") || strings.Contains(m, "cannot") || strings.Contains(m, "grant") {
			t.Errorf("warning as the README's user: %s %v", e.Message, e.ContextMap())
		}
	}
}

// readmeGrants are the GRANT statements of the README's least-privilege
// user for the flavour: lines ending in "-- MariaDB only" or "-- MySQL
// only" apply to that flavour alone.
func readmeGrants(t *testing.T, flavor mysqltest.Flavor) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "GRANT ") || !strings.Contains(line, "'cdcout'@'%'") {
			continue
		}
		stmt, comment, _ := strings.Cut(line, ";")
		switch {
		case strings.Contains(comment, "MariaDB only") && flavor != mysqltest.MariaDB,
			strings.Contains(comment, "MySQL only") && flavor != mysqltest.MySQL:
			continue
		}
		out = append(out, stmt)
	}
	if len(out) < 3 {
		t.Fatalf("README.md has %d GRANT lines for 'cdcout'@'%%'", len(out))
	}
	return out
}

// inBothModes runs test as a subtest of t once in each change identity
// mode (change_identity: gtid and digest), named after the mode.
func inBothModes(t *testing.T, test func(t *testing.T, mode string)) {
	for _, mode := range []string{"gtid", "digest"} {
		t.Run(mode, func(t *testing.T) { test(t, mode) })
	}
}
