package binlog

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestTransactionsAndOrdinals: a transaction over several tables yields its
// row changes in order, numbered from 0 across tables (counting rows of
// tables the filter hides), then one Commit; change keys follow the GTID.
func TestTransactionsAndOrdinals(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "tx")
	other := srv.CreateDB(t, "txother")
	srv.Exec(t,
		"CREATE TABLE `"+db+"`.a (id INT PRIMARY KEY, v VARCHAR(10))",
		"CREATE TABLE `"+db+"`.b (id INT NOT NULL, u INT NOT NULL, UNIQUE KEY uk (u), note TEXT)",
		"CREATE TABLE `"+db+"`.nokey (v INT)",
		"CREATE TABLE `"+other+"`.hidden (id INT PRIMARY KEY)",
	)
	s := openStream(t, testConfig(t, srv, db))
	c := collect(t, s)

	conn := srv.Open(t)
	tx, err := conn.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"INSERT INTO `" + db + "`.a VALUES (1,'x'),(2,'y')",
		"INSERT INTO `" + other + "`.hidden VALUES (1),(2),(3)",
		"UPDATE `" + db + "`.a SET v='z' WHERE id=2",
		"INSERT INTO `" + db + "`.b VALUES (7, 70, 'n')",
		"DELETE FROM `" + db + "`.a WHERE id=1",
		"INSERT INTO `" + db + "`.nokey VALUES (5)",
	} {
		if _, err := tx.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	evs := c.waitFor(t, func(evs []Event) bool {
		for _, ev := range evs {
			if ev.Commit != nil && ev.Commit.Rows > 0 {
				return true
			}
		}
		return false
	}, "commit")

	var got []string
	var commit *Commit
	for _, ev := range evs {
		if ev.Commit != nil {
			if ev.Commit.Rows > 0 {
				commit = ev.Commit
				break
			}
			continue
		}
		ch := ev.Change
		got = append(got, fmt.Sprintf("%s %s %d key=%s before=%s after=%s",
			ch.Op, ch.Source.Table, ch.Source.Row, canonical.KeyJSONOf(ch), jsonOf(t, ch.Before), jsonOf(t, ch.After)))
		if want := fmt.Sprintf("g:%s:%d", ch.Source.GTID, ch.Source.Row); ch.ChangeKey != want {
			t.Errorf("change key %q, want %q", ch.ChangeKey, want)
		}
		if ch.Source.GTID == "" || ch.Source.File == "" || ch.Source.Pos == 0 || ch.Source.ServerID != 1 || ch.Source.DB != db {
			t.Errorf("source incomplete: %+v", ch.Source)
		}
		if ch.Source.Connector != "cdcout" || ch.Source.Instance != "test" || ch.Source.TsMs == 0 || ch.TsMs == 0 {
			t.Errorf("source/ts: %+v ts %d", ch.Source, ch.TsMs)
		}
	}
	want := []string{
		`c a 0 key={"id":1} before=null after={"id":1,"v":"x"}`,
		`c a 1 key={"id":2} before=null after={"id":2,"v":"y"}`,
		// rows 2..4 are the hidden table's
		`u a 5 key={"id":2} before={"id":2,"v":"y"} after={"id":2,"v":"z"}`,
		`c b 6 key={"u":70} before=null after={"id":7,"note":"n","u":70}`,
		`d a 7 key={"id":1} before={"id":1,"v":"x"} after=null`,
		`c nokey 8 key=null before=null after={"v":5}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if commit == nil {
		t.Fatal("no commit")
	}
	if got, want := commit.Rows, 6; got != want {
		t.Errorf("commit rows = %d, want %d", got, want)
	}
	last := changesOf(evs)[0]
	if commit.GTID != last.Source.GTID || commit.Pos.GTIDSet == "" || commit.Pos.File == "" || commit.Pos.Pos == 0 {
		t.Errorf("commit %+v (gtid of rows %s)", commit, last.Source.GTID)
	}
	if set, err := gomysql.ParseGTIDSet(string(srv.Flavor), commit.Pos.GTIDSet); err != nil {
		t.Errorf("commit position %q: %v", commit.Pos.GTIDSet, err)
	} else if one, err := gomysql.ParseGTIDSet(string(srv.Flavor), commit.GTID); err != nil || !set.Contain(one) {
		t.Errorf("commit position %q does not include its gtid %q", commit.Pos.GTIDSet, commit.GTID)
	}
	if got := s.Position(); got.GTIDSet == "" {
		t.Errorf("Position() = %+v", got)
	}
}

// TestUncapturedRowsCounted: rows of uncaptured tables and databases are
// not decoded unless a captured row follows them in the transaction, and
// are counted into the ordinals either way — also past the deferral limit
// (maxDeferredBytes), and for updates (two images each).
func TestUncapturedRowsCounted(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "uncap")
	state := srv.CreateDB(t, "uncapstate")
	srv.Exec(t,
		"CREATE TABLE `"+db+"`.a (id INT PRIMARY KEY)",
		"CREATE TABLE `"+db+"`.hidden (id INT PRIMARY KEY, v LONGTEXT)",
		"CREATE TABLE `"+state+"`.s (id INT PRIMARY KEY, v LONGTEXT)",
	)
	cfg := testConfig(t, srv)
	cfg.Include = []string{db + ".a"}
	cfg.ExcludeDBs = []string{state}
	s := openStream(t, cfg)
	c := collect(t, s)

	conn := srv.Open(t)
	// The second transaction's first two rows are wide events (counted at
	// once), the next 17 narrower ones pass maxDeferredBytes together
	// (deferred, then counted).
	second := []string{
		fmt.Sprintf("INSERT INTO `%s`.s VALUES (10, REPEAT('a', %d))", state, wideEventBytes+1000), // 0
		fmt.Sprintf("INSERT INTO `%s`.s VALUES (11, REPEAT('b', %d))", state, wideEventBytes+1000), // 1
	}
	for i := range 17 { // 2 … 18
		second = append(second, fmt.Sprintf("INSERT INTO `%s`.s VALUES (%d, REPEAT('c', %d))", state, 20+i, wideEventBytes/2))
	}
	second = append(second,
		"INSERT INTO `"+db+"`.hidden VALUES (2, 'h'), (3, 'i')", // 19, 20
		"INSERT INTO `"+db+"`.a VALUES (3)",                     // 21
	)
	for _, stmts := range [][]string{
		{
			"INSERT INTO `" + db + "`.a VALUES (1)",                                   // 0
			"INSERT INTO `" + state + "`.s VALUES (1, 'x'), (2, 'y')",                 // 1, 2
			"UPDATE `" + state + "`.s SET v = 'z'",                                    // 3, 4
			"INSERT INTO `" + db + "`.hidden VALUES (1, 'h')",                         // 5
			"INSERT INTO `" + db + "`.a VALUES (2)",                                   // 6
			"INSERT INTO `" + state + "`.s VALUES (3, 'after the last captured row')", // 7
		},
		second,
	} {
		mysqltest.ExecTx(t, conn, stmts...)
	}
	evs := c.waitFor(t, func(evs []Event) bool { return len(changesOf(evs)) >= 3 }, "3 changes")
	var got []string
	for _, ch := range changesOf(evs) {
		got = append(got, fmt.Sprintf("%s %d %s", ch.Source.Table, ch.Source.Row, jsonOf(t, ch.After)))
	}
	want := []string{`a 0 {"id":1}`, `a 6 {"id":2}`, `a 21 {"id":3}`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func jsonOf(t testing.TB, r canonical.Row) string {
	t.Helper()
	if r == nil {
		return "null"
	}
	b, err := canonical.Marshal(r)
	if err != nil {
		t.Fatalf("marshal %v: %v", r, err)
	}
	return string(b)
}

func TestTableFilter(t *testing.T) {
	f, err := newTableFilter([]string{"shop.orders", "logs.*", "*.audit"}, []string{"cdcout"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		db, tbl string
		want    bool
	}{
		{"shop", "orders", true},
		{"shop", "items", false},
		{"logs", "anything", true},
		{"hr", "audit", true},
		{"cdcout", "audit", false},
		{"mysql", "user", false},
	} {
		if got := f.match(tc.db, tc.tbl); got != tc.want {
			t.Errorf("match(%s.%s) = %v, want %v", tc.db, tc.tbl, got, tc.want)
		}
	}
	all, _ := newTableFilter(nil, nil)
	if !all.match("a", "b") || all.match("sys", "x") || all.match("performance_schema", "x") || all.match("information_schema", "x") {
		t.Error("empty filter must match all but system databases")
	}
	for _, bad := range []string{"nodot", "a.b.c", "a*.b", ".x"} {
		if _, err := newTableFilter([]string{bad}, nil); err == nil {
			t.Errorf("pattern %q accepted", bad)
		}
	}
}

// TestCompressedBinlogMariaDB: with --log-bin-compress MariaDB writes
// *_COMPRESSED_EVENT_V1 row and query events; their rows come out like any
// others.
func TestCompressedBinlogMariaDB(t *testing.T) {
	mysqltest.OnlyFlavor(t, mysqltest.Shared(t), mysqltest.MariaDB, "MySQL's counterpart is TestTransactionCompressionMySQL")
	srv := mysqltest.Start(t, mysqltest.Options{Args: []string{"--log-bin-compress=ON", "--log-bin-compress-min-len=10"}})
	db := srv.CreateDB(t, "zip")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, body TEXT)")
	s := openStream(t, testConfig(t, srv, db))
	c := collect(t, s)
	long := strings.Repeat("compressible ", 40)
	srv.Exec(t,
		"INSERT INTO `"+db+"`.t VALUES (1, '"+long+"1'), (2, '"+long+"2')",
		"UPDATE `"+db+"`.t SET body = 'short' WHERE id = 1",
		"DELETE FROM `"+db+"`.t WHERE id = 2",
	)
	got := describe(t, c.waitChanges(t, 4))
	want := []string{
		`c t null {"body":"` + long + `1","id":1}`,
		`c t null {"body":"` + long + `2","id":2}`,
		`u t {"body":"` + long + `1","id":1} {"body":"short","id":1}`,
		`d t {"body":"` + long + `2","id":2} null`,
	}
	checkLines(t, got, want)

	// Prove the events really were compressed.
	compressed := 0
	for typ, n := range binlogEventTypes(t, srv) {
		if strings.Contains(strings.ToLower(typ), "compressed") {
			compressed += n
		}
	}
	if compressed < 3 {
		t.Fatalf("only %d compressed events in the binlog; the server did not compress", compressed)
	}
}

// TestReconnectAfterRestart: the server is killed and restarted while rows
// are being written; the stream reconnects from its last commit and every
// committed row arrives (some possibly twice, with the same change key).
func TestReconnectAfterRestart(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{})
	db := srv.CreateDB(t, "restart")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, g INT)")
	cfg := testConfig(t, srv, db)
	cfg.HeartbeatPeriod = 500 * time.Millisecond
	cfg.ReadTimeout = 2 * time.Second
	s := openStream(t, cfg)
	c := collect(t, s)

	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		conn, err := sql.Open("mysql", srv.DSN)
		if err != nil {
			return
		}
		defer conn.Close()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Two rows per transaction; a failed insert (server down) is
			// retried until it commits, so ids stay dense.
			for {
				_, err := conn.Exec(fmt.Sprintf("INSERT IGNORE INTO `%s`.t VALUES (%d, %d), (%d, %d)", db, 2*i, i, 2*i+1, i))
				if err == nil {
					break
				}
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
	}()
	c.waitChanges(t, 50)
	if err := srv.Restart(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	before := len(changesOf(c.snapshot()))
	c.waitChanges(t, before+100)
	close(stop)
	<-writerDone

	var ids []int
	rows, err := srv.Open(t).Query("SELECT id FROM `" + db + "`.t ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int
		rows.Scan(&id)
		ids = append(ids, id)
	}
	rows.Close()
	evs := c.waitFor(t, func(evs []Event) bool {
		seen := map[int64]bool{}
		for _, ch := range changesOf(evs) {
			seen[ch.After["id"].(int64)] = true
		}
		for _, id := range ids {
			if !seen[int64(id)] {
				return false
			}
		}
		return true
	}, "all %d rows", len(ids))
	// Replays are whole transactions with the same keys.
	keys := map[string]string{}
	for _, ch := range changesOf(evs) {
		id := fmt.Sprint(ch.After["id"])
		if prev, ok := keys[ch.ChangeKey]; ok && prev != id {
			t.Fatalf("change key %s used for rows %s and %s", ch.ChangeKey, prev, id)
		}
		keys[ch.ChangeKey] = id
	}
	t.Logf("%d rows in the table, %d changes streamed (%d distinct keys)", len(ids), len(changesOf(evs)), len(keys))
}

// blackhole is a TCP proxy whose existing connections can be frozen: bytes
// are read and dropped, sockets stay open. That is a half-open connection
// as a dead NAT entry or a hung server produces it: no error, just silence.
type blackhole struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []*atomic.Bool // frozen flags of live connections
}

func newBlackhole(t *testing.T, target string) *blackhole {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackhole{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			frozen := new(atomic.Bool)
			p.mu.Lock()
			p.conns = append(p.conns, frozen)
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if err != nil {
						dst.Close()
						return
					}
					if !frozen.Load() {
						if _, err := dst.Write(buf[:n]); err != nil {
							src.Close()
							return
						}
					}
				}
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return p
}

func (p *blackhole) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.conns {
		f.Store(true)
	}
}

// TestReadTimeoutReconnects: when the connection goes silent (heartbeats
// stop arriving) the read timeout declares it dead and the stream
// reconnects from its last commit.
func TestReadTimeoutReconnects(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "halfopen")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY)")
	proxy := newBlackhole(t, fmt.Sprintf("%s:%d", srv.Host, srv.Port))
	dsn, err := mysql.ParseDSN(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	dsn.Addr = proxy.ln.Addr().String()
	cfg := testConfig(t, srv, db)
	cfg.DSN = dsn.FormatDSN()
	cfg.HeartbeatPeriod = 300 * time.Millisecond
	cfg.ReadTimeout = 1500 * time.Millisecond
	core, logs := observer.New(zapcore.WarnLevel)
	cfg.Logger = zap.New(core)
	s := openStream(t, cfg)
	c := collect(t, s)
	srv.Exec(t, "INSERT INTO `"+db+"`.t VALUES (1)")
	c.waitChanges(t, 1)

	proxy.freeze()
	frozenAt := time.Now()
	srv.Exec(t, "INSERT INTO `"+db+"`.t VALUES (2)", "INSERT INTO `"+db+"`.t VALUES (3)")
	evs := c.waitChanges(t, 3)
	if d := time.Since(frozenAt); d < cfg.ReadTimeout {
		t.Fatalf("rows arrived %s after the freeze, before the read timeout: the proxy did not freeze", d)
	}
	var ids []any
	for _, ch := range changesOf(evs) {
		ids = append(ids, ch.After["id"])
	}
	if fmt.Sprint(ids) != "[1 2 3]" {
		t.Fatalf("ids %v, want [1 2 3]", ids)
	}
	if n := logs.FilterMessage("binlog connection lost; resuming at the last commit").Len(); n == 0 {
		t.Fatal("no reconnect logged")
	}
}

// TestEmptyCommitsCoalesced: transactions with no captured rows still move
// the position, but a burst of them costs at most about one Commit a
// second; the last one is flushed at the next heartbeat.
func TestEmptyCommitsCoalesced(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "empty")
	other := srv.CreateDB(t, "emptyother")
	srv.Exec(t, "CREATE TABLE `"+other+"`.t (id INT PRIMARY KEY)")
	cfg := testConfig(t, srv, db)
	cfg.HeartbeatPeriod = 200 * time.Millisecond
	s := openStream(t, cfg)
	c := collect(t, s)
	conn := srv.Open(t)
	for i := 0; i < 50; i++ {
		if _, err := conn.Exec(fmt.Sprintf("INSERT INTO `%s`.t VALUES (%d)", other, i)); err != nil {
			t.Fatal(err)
		}
	}
	end := mysqltest.GTIDPos(t, conn)
	evs := c.waitFor(t, func([]Event) bool { return s.Position().GTIDSet == end }, "position %s", end)
	commits := 0
	for _, ev := range evs {
		if ev.Commit != nil {
			commits++
			if ev.Commit.Rows != 0 {
				t.Fatalf("commit with %d rows from an uncaptured table", ev.Commit.Rows)
			}
		}
	}
	if commits == 0 || commits > 10 {
		t.Fatalf("%d commits for 50 empty transactions, want a few", commits)
	}
	if n := len(changesOf(evs)); n != 0 {
		t.Fatalf("%d changes from an uncaptured database", n)
	}
}

// TestStatementFormatSessionReported: a session that switches to
// binlog_format=STATEMENT leaves no row images; the stream cannot capture
// its change and says so in the log instead of passing over it silently.
func TestStatementFormatSessionReported(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "stmt")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY)")
	cfg := testConfig(t, srv, db)
	core, logs := observer.New(zapcore.ErrorLevel)
	cfg.Logger = zap.New(core)
	s := openStream(t, cfg)
	c := collect(t, s)
	ctx := t.Context()
	conn, err := srv.Open(t).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{
		"SET SESSION binlog_format = 'STATEMENT'",
		"INSERT INTO `" + db + "`.t VALUES (1)",
		"SET SESSION binlog_format = 'ROW'",
		"INSERT INTO `" + db + "`.t VALUES (2)",
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	evs := c.waitChanges(t, 1)
	if got := changesOf(evs)[0].After["id"]; got != int64(2) {
		t.Fatalf("first change id %v, want 2", got)
	}
	entries := logs.FilterMessageSnippet("statement-based change").All()
	if len(entries) != 1 || entries[0].ContextMap()["statement"] != "INSERT" {
		t.Fatalf("log entries %+v, want one for the INSERT", entries)
	}
}

func TestStatementClassification(t *testing.T) {
	for _, tc := range []struct {
		q   string
		ddl bool
		dml string
	}{
		{"ALTER TABLE t ADD c INT", true, ""},
		{"/* generated */ rename table a to b", true, ""},
		{"DROP TABLE `x`", true, ""},
		{"TRUNCATE t", true, ""},
		{"CREATE TABLE t (id INT)", true, ""},
		{"insert into t values (1)", false, "INSERT"},
		{"UPDATE t SET a=1", false, "UPDATE"},
		{"BEGIN", false, ""},
		{"SAVEPOINT s1", false, ""},
	} {
		if got := isDDL([]byte(tc.q)); got != tc.ddl {
			t.Errorf("isDDL(%q) = %v", tc.q, got)
		}
		if got := dmlVerb([]byte(tc.q)); got != tc.dml {
			t.Errorf("dmlVerb(%q) = %q, want %q", tc.q, got, tc.dml)
		}
	}
}

// TestTransactionPayloadUnwrapped: MySQL's binlog_transaction_compression
// wraps a transaction's events in one TRANSACTION_PAYLOAD event, which
// go-mysql decompresses into Events. The throwaway server is MariaDB, so
// the test wraps real parsed events of a transaction in a payload event
// the way MySQL would, and checks the stream emits the same changes and
// commit as for the plain events, with the payload's position.
func TestTransactionPayloadUnwrapped(t *testing.T) {
	srv := mysqltest.Shared(t)
	mysqltest.OnlyFlavor(t, srv, mysqltest.MariaDB, "it wraps MariaDB's events in a synthetic payload; MySQL writes real ones in TestTransactionCompressionMySQL")
	db := srv.CreateDB(t, "payload")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (id INT PRIMARY KEY, v VARCHAR(10))")
	from := mysqltest.GTIDPos(t, srv.Open(t))
	srv.Exec(t, "INSERT INTO `"+db+"`.t VALUES (1, 'a'), (2, 'b')")

	// Read the transaction's events as go-mysql parses them.
	s := openStream(t, testConfig(t, srv, db))
	scfg, err := s.syncerConfig()
	if err != nil {
		t.Fatal(err)
	}
	syncer := replication.NewBinlogSyncer(scfg)
	defer syncer.Close()
	gset, _ := gomysql.ParseMariadbGTIDSet(from)
	streamer, err := syncer.StartSyncGTID(gset)
	if err != nil {
		t.Fatal(err)
	}
	var gtidEv, rotate *replication.BinlogEvent
	var inner []*replication.BinlogEvent
	for gtidEv == nil || len(inner) == 0 || inner[len(inner)-1].Header.EventType != replication.XID_EVENT {
		ev, err := streamer.GetEvent(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Event.(type) {
		case *replication.RotateEvent:
			rotate = ev
		case *replication.MariadbGTIDEvent:
			gtidEv = ev
		case *replication.QueryEvent, *replication.TableMapEvent, *replication.RowsEvent, *replication.XIDEvent:
			if gtidEv != nil {
				inner = append(inner, ev)
			}
		}
	}
	last := inner[len(inner)-1].Header
	payload := &replication.BinlogEvent{
		Header: &replication.EventHeader{EventType: replication.TRANSACTION_PAYLOAD_EVENT, ServerID: 1,
			Timestamp: last.Timestamp, LogPos: last.LogPos, EventSize: last.LogPos - inner[0].Header.LogPos + inner[0].Header.EventSize},
		Event: &replication.TransactionPayloadEvent{Events: inner},
	}

	var got []Event
	before, _ := gomysql.ParseMariadbGTIDSet(from)
	r := &reader{s: s, resume: startPoint{gset: before}, lastCommit: time.Now(), h: func(_ context.Context, ev Event) error {
		got = append(got, ev)
		return nil
	}}
	for _, ev := range []*replication.BinlogEvent{rotate, gtidEv, payload} {
		if err := r.event(t.Context(), ev, ev.Header); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 3 || got[0].Change == nil || got[1].Change == nil || got[2].Commit == nil {
		t.Fatalf("events %+v, want two changes and a commit", got)
	}
	for i, ev := range got[:2] {
		ch := ev.Change
		if ch.Source.Row != i || ch.After["id"] != int64(i+1) || ch.Source.Pos != payload.Header.LogPos-payload.Header.EventSize {
			t.Errorf("change %d: row %d after %v pos %d", i, ch.Source.Row, ch.After, ch.Source.Pos)
		}
	}
	if c := got[2].Commit; c.Rows != 2 || c.Pos.Pos != payload.Header.LogPos || !strings.Contains(c.Pos.GTIDSet, c.GTID) {
		t.Errorf("commit %+v", c)
	}
}

// TestXATransactions: a prepared XA transaction's rows reach the handler
// with its XA COMMIT (after transactions committed in between), never after
// an XA ROLLBACK; while it is prepared, commits carry the position before
// it, so a stream resumed from such a checkpoint still emits its rows.
func TestXATransactions(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "xa")
	tbl := "`" + db + "`.t"
	srv.Exec(t, "CREATE TABLE "+tbl+" (id INT PRIMARY KEY)")
	s := openStream(t, testConfig(t, srv, db))
	c := collect(t, s)

	conn, err := srv.Open(t).Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ids := func(evs []Event) string {
		var out []string
		for _, ch := range changesOf(evs) {
			out = append(out, jsonOf(t, ch.After))
		}
		return strings.Join(out, " ")
	}
	lastCommit := func(evs []Event) *Commit {
		for i := len(evs) - 1; i >= 0; i-- {
			if evs[i].Commit != nil {
				return evs[i].Commit
			}
		}
		return nil
	}

	// The XA statements run on one session, the plain inserts on others:
	// a session with a prepared transaction can run nothing else.
	srv.Exec(t, "INSERT INTO "+tbl+" VALUES (1)")
	before := lastCommit(c.waitChanges(t, 1))
	mysqltest.ConnExec(t, conn, "XA START 'a'", "INSERT INTO "+tbl+" VALUES (2)", "XA END 'a'", "XA PREPARE 'a'")
	srv.Exec(t, "INSERT INTO "+tbl+" VALUES (3)")
	evs := c.waitChanges(t, 2)
	if got := ids(evs); got != `{"id":1} {"id":3}` {
		t.Fatalf("before XA COMMIT: %s, want 1 and 3 (2 is only prepared)", got)
	}
	held := c.waitFor(t, func(evs []Event) bool {
		cm := lastCommit(evs)
		return cm != nil && cm.Rows == 1 && len(changesOf(evs)) == 2
	}, "the commit of 3")
	if got, want := lastCommit(held).Pos, before.Pos; got != want || !lastCommit(held).Held {
		t.Fatalf("commit while 'a' is prepared carries %+v (held %v), want the position before it %+v, held", got, lastCommit(held).Held, want)
	}
	if n, since := s.PreparedXA(); n != 1 || since.IsZero() {
		t.Fatalf("PreparedXA = %d since %v, want 1", n, since)
	}
	mysqltest.ConnExec(t, conn, "XA COMMIT 'a'")
	evs = c.waitChanges(t, 3)
	if n, _ := s.PreparedXA(); n != 0 {
		t.Fatalf("PreparedXA = %d after XA COMMIT, want 0", n)
	}
	if got := ids(evs); got != `{"id":1} {"id":3} {"id":2}` {
		t.Fatalf("after XA COMMIT: %s, want 2 after 3", got)
	}
	two := changesOf(evs)[2]
	if !strings.HasPrefix(two.ChangeKey, "g:"+two.Source.GTID+":") || two.Source.Row != 0 {
		t.Fatalf("XA row keyed %s (gtid %s, row %d), want the PREPARE's GTID and ordinal 0", two.ChangeKey, two.Source.GTID, two.Source.Row)
	}
	mysqltest.ConnExec(t, conn, "XA START 'b'", "INSERT INTO "+tbl+" VALUES (4)", "XA END 'b'", "XA PREPARE 'b'", "XA ROLLBACK 'b'")
	srv.Exec(t, "INSERT INTO "+tbl+" VALUES (5)")
	evs = c.waitChanges(t, 4)
	if got := ids(evs); got != `{"id":1} {"id":3} {"id":2} {"id":5}` {
		t.Fatalf("after XA ROLLBACK: %s, want 4 never emitted", got)
	}

	// A restart from the held-back checkpoint replays 3 and still emits 2.
	cfg := testConfig(t, srv, db)
	cfg.Resume = &held[len(held)-1].Commit.Pos
	c2 := collect(t, openStream(t, cfg))
	evs = c2.waitChanges(t, 3)
	if got := ids(evs); got != `{"id":3} {"id":2} {"id":5}` {
		t.Fatalf("resumed from the held-back checkpoint: %s, want 3 2 5", got)
	}
}
