package backfill_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/engine"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/state"
)

func TestMain(m *testing.M) { mysqltest.RunMain(m) }

// rowState is a row as the receiver and the table see it.
type rowState struct {
	V int64
	S string
}

// receiver applies webhook deliveries in arrival order, per key.
type receiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got map[int64]rowState
	ops map[string]int
	// reads counts op "r" deliveries per key.
	reads map[int64]int
	seen  map[string]bool
	dups  int
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{got: map[int64]rowState{}, ops: map[string]int{}, reads: map[int64]int{}, seen: map[string]bool{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var env struct {
			ID    string `json:"id"`
			Op    string `json:"op"`
			Key   struct{ ID int64 }
			After *struct {
				ID int64
				V  int64
				S  string
			}
			Source struct{ DB, Table string }
		}
		if err := json.Unmarshal(b, &env); err != nil {
			t.Errorf("bad delivery %s: %v", b, err)
			w.WriteHeader(400)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.seen[env.ID] {
			r.dups++
			return
		}
		r.seen[env.ID] = true
		if env.Source.Table != "t" {
			t.Errorf("delivery of table %s.%s: %s", env.Source.DB, env.Source.Table, b)
		}
		r.ops[env.Op]++
		switch env.Op {
		case "d":
			delete(r.got, env.Key.ID)
		case "c", "u", "r":
			r.got[env.Key.ID] = rowState{V: env.After.V, S: env.After.S}
			if env.Op == "r" {
				r.reads[env.Key.ID]++
			}
		}
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func tableState(t testing.TB, db *sql.DB, table string) map[int64]rowState {
	t.Helper()
	rows, err := db.Query("SELECT id, v, s FROM " + table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]rowState{}
	for rows.Next() {
		var id int64
		var s rowState
		if err := rows.Scan(&id, &s.V, &s.S); err != nil {
			t.Fatal(err)
		}
		out[id] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func gtidPos(t testing.TB, db *sql.DB) string {
	t.Helper()
	return mysqltest.GTIDPos(t, db)
}

// gtidSeq is the sequence number of a single-domain MariaDB GTID position.
func gtidSeq(pos string) int64 {
	i := strings.LastIndexByte(pos, '-')
	n, _ := strconv.ParseInt(pos[i+1:], 10, 64)
	return n
}

func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	wait.Until(t, what, d, cond)
}

func engineConfig(t testing.TB, srv *mysqltest.Server, stateDB, from, instance string, sinks []config.Sink) *config.Config {
	t.Helper()
	cfg := config.Default()
	cfg.DSN = config.DSN(srv.DSN)
	cfg.StateDB = stateDB
	cfg.Instance = instance
	cfg.From = from
	cfg.HTTPAddr = "off"
	cfg.Sinks = sinks
	cfg.FillSinkDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func startEngine(t testing.TB, cfg *config.Config, logger *zap.Logger) func() {
	e, err := engine.New(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	return wait.Background(t, 60*time.Second, e.Run)
}

func dropWatermarkDB(t testing.TB, srv *mysqltest.Server, stateDB string) {
	t.Cleanup(func() {
		db := srv.Open(t)
		_, _ = db.Exec("DROP DATABASE IF EXISTS `" + backfill.WatermarkDB(stateDB) + "`")
	})
}

// backfillDBs creates a source and a state database (given their name
// prefixes) whose watermark database is dropped when the test ends.
func backfillDBs(t testing.TB, srv *mysqltest.Server, srcName, stateName string) (src, stateDB string) {
	src, stateDB = srv.CreateDB(t, srcName), srv.CreateDB(t, stateName)
	dropWatermarkDB(t, srv, stateDB)
	return src, stateDB
}

// seedTable creates src.t (id, v, s) holding rows 1..n and returns its
// quoted name.
func seedTable(t testing.TB, srv *mysqltest.Server, src string, n int) string {
	table := "`" + src + "`.t"
	srv.Exec(t, "CREATE TABLE "+table+" (id INT PRIMARY KEY, v BIGINT NOT NULL, s VARCHAR(40) NOT NULL)",
		fmt.Sprintf("INSERT INTO %s SELECT seq, seq, CONCAT('row', seq) FROM %s", table, mysqltest.Seq(n)))
	return table
}

// TestConsistencyUnderWrites backfills a table while a writer updates,
// deletes and inserts random keys, with an engine (the "cdcout run")
// holding the enqueue lease and delivering to a webhook. Applying the
// deliveries in arrival order per key must give exactly the table's final
// state. CDCOUT_BACKFILL_ROWS sizes the table (default 20,000; the issue's
// figure is 200,000).
func TestConsistencyUnderWrites(t *testing.T) {
	consistencyUnderWrites(t, mysqltest.BenchEnv("CDCOUT_BACKFILL_ROWS", 20_000), false)
}

// TestReadOnlyConsistencyUnderWrites is TestConsistencyUnderWrites for a
// read-only backfill whose source user (the runner's and the stream's)
// has only SELECT on the table's database and REPLICATION SLAVE and
// REPLICATION CLIENT: nothing may be written to the source. The state
// database is reached as root, as a separate state_dsn would be.
// CDCOUT_BACKFILL_ROWS sizes it too (default here 10,000).
func TestReadOnlyConsistencyUnderWrites(t *testing.T) {
	consistencyUnderWrites(t, mysqltest.BenchEnv("CDCOUT_BACKFILL_ROWS", 10_000), true)
}

// readOnlyUser creates a user with SELECT on db and the replication
// grants only, and returns its DSN.
func readOnlyUser(t testing.TB, srv *mysqltest.Server, db string) string {
	t.Helper()
	user := "ro_" + db
	if len(user) > 32 {
		user = user[:32]
	}
	const pw = "ro-secret-1"
	srv.Exec(t, "CREATE USER IF NOT EXISTS '"+user+"'@'%' IDENTIFIED BY '"+pw+"'",
		"GRANT SELECT ON `"+db+"`.* TO '"+user+"'@'%'",
		"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '"+user+"'@'%'")
	t.Cleanup(func() {
		d := srv.Open(t)
		_, _ = d.Exec("DROP USER IF EXISTS '" + user + "'@'%'")
	})
	return fmt.Sprintf("%s:%s@tcp(127.0.0.1:%d)/?parseTime=false", user, pw, srv.Port)
}

func consistencyUnderWrites(t *testing.T, n int, readOnly bool) {
	srv := mysqltest.Shared(t)
	src, stateDB := backfillDBs(t, srv, "bf_src", "bf_state")
	table := seedTable(t, srv, src, n)
	db := srv.Open(t)
	from := gtidPos(t, db)

	recv := newReceiver(t)
	logger := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	cfg := engineConfig(t, srv, stateDB, from, "cons", []config.Sink{{Name: "hook", URL: recv.srv.URL, BatchSize: 200, Concurrency: 8}})
	source := db
	if readOnly {
		roDSN := readOnlyUser(t, srv, src)
		cfg.StateDSN = config.DSN(srv.DSN)
		cfg.DSN = config.DSN(roDSN)
		ro, err := sql.Open("mysql", roDSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ro.Close() })
		source = ro
	}
	stopEngine := startEngine(t, cfg, logger)

	// The writer runs until the backfill is done.
	stopWriter := writer(t, srv.Open(t), table, n)

	if err := state.Migrate(context.Background(), db, stateDB); err != nil {
		t.Fatal(err)
	}
	r := &backfill.Runner{Source: source, State: db, StateSchema: stateDB, Logger: logger}
	info, err := r.Prepare(context.Background(), backfill.Spec{Table: src + ".t", Sinks: []string{"hook"}, ChunkSize: 500, Instance: "cons", ReadOnly: readOnly})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	writes := stopWriter()
	t.Logf("backfill %s (read-only %v) of %d rows took %s (%.0f rows/s) beside %d concurrent writes", info.ID, readOnly, n, took, float64(n)/took.Seconds(), writes)
	if readOnly {
		var dbs int
		if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", backfill.WatermarkDB(stateDB)).Scan(&dbs); err != nil || dbs != 0 {
			t.Errorf("read-only backfill: watermark database exists (%d, %v)", dbs, err)
		}
	}

	// Everything up to the writer's last commit enqueued and delivered.
	end := gtidSeq(gtidPos(t, db))
	// Catching up scales with the table (a 200k run delivers ~500k records).
	catchUp := 60*time.Second + time.Duration(n/500)*time.Second
	waitFor(t, "checkpoint past the last write", catchUp, func() bool {
		var raw string
		if err := db.QueryRow("SELECT position FROM `" + stateDB + "`.checkpoints WHERE source = 'enqueue/cons'").Scan(&raw); err != nil {
			return false
		}
		var p struct {
			GTIDSet string `json:"gtid_set"`
		}
		_ = json.Unmarshal([]byte(raw), &p)
		return p.GTIDSet != "" && gtidSeq(p.GTIDSet) >= end
	})
	waitDelivered(t, db, stateDB, catchUp)
	stopEngine()

	want := tableState(t, db, table)
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if recv.dups != 0 {
		t.Errorf("%d redeliveries", recv.dups)
	}
	if recv.ops["r"] == 0 {
		t.Fatalf("no backfilled row delivered (ops %v)", recv.ops)
	}
	for id, w := range want {
		g, ok := recv.got[id]
		if !ok {
			t.Errorf("key %d: in the table %+v, never delivered", id, w)
			continue
		}
		if g != w {
			t.Errorf("key %d: receiver has %+v, table has %+v", id, g, w)
		}
	}
	for id, g := range recv.got {
		if _, ok := want[id]; !ok {
			t.Errorf("key %d: receiver has %+v, deleted from the table", id, g)
		}
	}
	for id, c := range recv.reads {
		if c > 1 {
			t.Errorf("key %d: %d backfilled rows, want at most 1", id, c)
		}
	}
	var st string
	if err := db.QueryRow("SELECT status FROM `"+stateDB+"`.backfills WHERE id = ?", info.ID).Scan(&st); err != nil || st != backfill.StatusDone {
		t.Errorf("backfill status %q (%v), want done", st, err)
	}
	t.Logf("deliveries by op: %v; %d keys in the final table", recv.ops, len(want))
}

// TestBadInput: unknown table, keyless table and a failing --where are
// reported as ErrBadInput before anything is written.
func TestBadInput(t *testing.T) {
	srv := mysqltest.Shared(t)
	src, stateDB := backfillDBs(t, srv, "bf_bad", "bf_badstate")
	srv.Exec(t, "CREATE TABLE `"+src+"`.nokey (a INT, b INT, UNIQUE KEY (a))", "CREATE TABLE `"+src+"`.ok (id INT PRIMARY KEY)")
	db := srv.Open(t)
	if _, err := db.Exec("CREATE DATABASE IF NOT EXISTS `" + stateDB + "`"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec backfill.Spec
		want string
	}{
		{backfill.Spec{Table: src + ".missing"}, "does not exist"},
		{backfill.Spec{Table: src + ".nokey"}, "ADD PRIMARY KEY"},
		{backfill.Spec{Table: src + ".ok", Where: "nosuchcolumn > 1"}, "Unknown column 'nosuchcolumn'"},
		{backfill.Spec{Table: "nodot"}, "want db.table"},
	} {
		r := &backfill.Runner{Source: db, State: db, StateSchema: stateDB}
		_, err := r.Prepare(context.Background(), tc.spec)
		if !errors.Is(err, backfill.ErrBadInput) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Prepare(%+v) = %v, want ErrBadInput containing %q", tc.spec, err, tc.want)
		}
	}
}

// TestTypesCompositeKeyWhere: a backfilled row carries the same canonical
// after image as the streamed insert of the same row, for every common
// column type; a composite key is paged through in small chunks; --where
// limits the rows.
func TestTypesCompositeKeyWhere(t *testing.T) {
	srv := mysqltest.Shared(t)
	src, stateDB := backfillDBs(t, srv, "bft_src", "bft_state")
	db := srv.Open(t)
	if err := state.Migrate(context.Background(), db, stateDB); err != nil {
		t.Fatal(err)
	}
	table := "`" + src + "`.ty"
	srv.Exec(t, "CREATE TABLE "+table+` (
  a INT NOT NULL, b VARCHAR(10) NOT NULL,
  ti TINYINT, su SMALLINT UNSIGNED, bu BIGINT UNSIGNED, de DECIMAL(10,3), fl FLOAT, do DOUBLE, bi BIT(5),
  da DATE, dt DATETIME(3), ts TIMESTAMP(6) NULL, tm TIME(2), yr YEAR, ch CHAR(3), la VARCHAR(10) CHARACTER SET latin1,
  bn BINARY(4), vb VARBINARY(8), bl BLOB, tx TEXT, en ENUM('x','y'), st SET('p','q','r'), js JSON, nu INT NULL,
  PRIMARY KEY (a, b))`)
	from := gtidPos(t, db)
	cfg := engineConfig(t, srv, stateDB, from, "types", []config.Sink{{Name: "out", URL: "stdout:"}})
	defer startEngineQuiet(t, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))()

	var vals []string
	for a := 1; a <= 6; a++ {
		for _, b := range []string{"k", "k`2", "é"} {
			vals = append(vals, fmt.Sprintf(`(%d, '%s', -%d, %d, 18446744073709551615, %d.125, 1.5, 2.25e-300, b'10101', '2026-0%d-02', '2026-01-02 03:04:05.%03d', '2026-01-02 03:04:05.000001', '-12:34:56.7', 2026, 'ab', 'café', 'a\0', x'00ff', x'deadbeef', 'long text', 'y', 'p,r', '{"z": [1, 2.50], "a": null}', NULL)`,
				a, b, a, a*100, a, a, a))
		}
	}
	srv.Exec(t, "INSERT INTO "+table+" VALUES "+strings.Join(vals, ","))
	waitFor(t, "the inserts enqueued", 30*time.Second, func() bool {
		return countOp(t, db, stateDB, "c") == len(vals)
	})
	r := &backfill.Runner{Source: db, State: db, StateSchema: stateDB}
	if _, err := r.Prepare(context.Background(), backfill.Spec{Table: src + ".ty", Sinks: []string{"out"}, ChunkSize: 4, Where: "a <> 5", Instance: "types"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	afters := map[string]map[string]string{} // row_key → op → after JSON
	recs, err := outbox.ReadRecords(context.Background(), db, stateDB, "%")
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		key, op := rec.Key, rec.Op
		var env struct{ After json.RawMessage }
		if err := json.Unmarshal(rec.Payload, &env); err != nil {
			t.Fatal(err)
		}
		if afters[key] == nil {
			afters[key] = map[string]string{}
		}
		if _, dup := afters[key][op]; dup {
			t.Errorf("key %s: two %q records", key, op)
		}
		afters[key][op] = string(env.After)
	}
	reads := 0
	for key, m := range afters {
		if strings.HasPrefix(key, `{"a":5,`) {
			if _, ok := m["r"]; ok {
				t.Errorf("key %s backfilled despite --where a <> 5", key)
			}
			continue
		}
		if m["r"] == "" {
			t.Errorf("key %s not backfilled", key)
			continue
		}
		reads++
		if m["r"] != m["c"] {
			t.Errorf("key %s:\nstreamed   %s\nbackfilled %s", key, m["c"], m["r"])
		}
	}
	if want := len(vals) - 3; reads != want {
		t.Fatalf("%d rows backfilled, want %d", reads, want)
	}
}

// TestCancel: a runner whose chunks are never applied (nothing streams)
// waits; cancelling the backfill stops it with ErrCancelled, and status
// lists it as cancelled.
func TestCancel(t *testing.T) {
	srv := mysqltest.Shared(t)
	src, stateDB := backfillDBs(t, srv, "bfc_src", "bfc_state")
	srv.Exec(t, "CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY)", "INSERT INTO `"+src+"`.t SELECT seq FROM "+mysqltest.Seq(100))
	db := srv.Open(t)
	if err := state.Migrate(context.Background(), db, stateDB); err != nil {
		t.Fatal(err)
	}
	r := &backfill.Runner{Source: db, State: db, StateSchema: stateDB, InFlight: 2}
	info, err := r.Prepare(context.Background(), backfill.Spec{Table: src + ".t", Sinks: []string{"x"}, ChunkSize: 10, Instance: "c"})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	waitFor(t, "two chunks waiting", 20*time.Second, func() bool {
		var n int
		_ = db.QueryRow("SELECT COUNT(*) FROM `"+stateDB+"`.backfill_chunks WHERE backfill_id = ?", info.ID).Scan(&n)
		return n == 2
	})
	// A signal that started this backfill reads cancelled as soon as
	// Cancel returns: the two are written in one transaction.
	sigID, err := backfill.InsertSignal(context.Background(), db, stateDB, backfill.Signal{Instance: "cancel", Table: "x.t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := backfill.SignalStarted(context.Background(), db, stateDB, sigID, info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := backfill.Cancel(context.Background(), db, stateDB, info.ID); err != nil {
		t.Fatal(err)
	}
	if sig, err := backfill.Signals(context.Background(), db, stateDB, "cancel", 1); err != nil || len(sig) != 1 ||
		sig[0].Status != backfill.StatusCancelled || sig[0].BackfillID != info.ID {
		t.Fatalf("signals after Cancel = %+v, %v; want the signal cancelled, of backfill %s", sig, err, info.ID)
	}
	// A signal linked after the cancel (Prepare resumed the backfill just
	// before it) is not linked: it stays pending for the next round, where
	// it would otherwise read running for good.
	late, err := backfill.InsertSignal(context.Background(), db, stateDB, backfill.Signal{Instance: "cancel", Table: "x.t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := backfill.SignalStarted(context.Background(), db, stateDB, late, info.ID); !errors.Is(err, backfill.ErrSignalNotLinked) {
		t.Fatalf("SignalStarted on the cancelled backfill = %v, want ErrSignalNotLinked", err)
	}
	if sig, err := backfill.Signals(context.Background(), db, stateDB, "cancel", 2); err != nil || len(sig) != 2 ||
		sig[0].ID != late || sig[0].Status != backfill.SignalPending || sig[0].BackfillID != "" {
		t.Fatalf("signals after the late link = %+v, %v; want signal %d pending, of no backfill", sig, err, late)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, backfill.ErrCancelled) {
			t.Fatalf("Run = %v, want ErrCancelled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not stop after cancel")
	}
	list, err := backfill.List(context.Background(), db, stateDB)
	if err != nil || len(list) != 1 || list[0].Status != backfill.StatusCancelled || list[0].RowsDone != 0 {
		t.Fatalf("List = %+v, %v; want one cancelled backfill with 0 rows done", list, err)
	}
	if _, err := backfill.Cancel(context.Background(), db, stateDB, "nosuch"); !errors.Is(err, backfill.ErrNotFound) {
		t.Fatalf("Cancel(nosuch) = %v, want ErrNotFound", err)
	}
}

// countOp counts the records of op in the outbox of stateDB, rows and
// segments alike.
func countOp(tb testing.TB, db *sql.DB, stateDB, op string) int {
	tb.Helper()
	recs, err := outbox.ReadRecords(context.Background(), db, stateDB, "%")
	if err != nil {
		tb.Fatal(err)
	}
	n := 0
	for _, r := range recs {
		if r.Op == op {
			n++
		}
	}
	return n
}
