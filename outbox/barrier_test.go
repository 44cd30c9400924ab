package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/sink"
)

// ddlItem is a schema-change record for pipe (a RENAME from oldTable when
// set).
func ddlItem(pipe string, txn int, oldTable string) Pending {
	d := &canonical.DDL{Kind: canonical.DDLAlter, Statement: "ALTER TABLE users ADD c INT", DB: "app", Table: "users",
		Columns: []canonical.DDLColumn{{Name: "id", Type: "int", Key: "PRI"}, {Name: "c", Type: "int", Nullable: true}}}
	if oldTable != "" {
		d.Kind, d.Statement, d.OldDB, d.OldTable = canonical.DDLRename, "RENAME TABLE "+oldTable+" TO users", "app", oldTable
	}
	c := &canonical.Change{Op: canonical.OpDDL, Key: canonical.DDLKey("app", "users"), DDL: d, TsMs: 1_700_000_000_456,
		Source: canonical.Source{Connector: "cdcout", DB: "app", Table: "users", GTID: fmt.Sprint("0-1-", txn), TsMs: 1_700_000_000_123}}
	return Pending{Pipe: pipe, Sink: sinkOf(pipe), Change: c, ChangeKey: fmt.Sprintf("s:0-1-%d:0", txn), Digest: canonical.DigestChange(pipe, c)}
}

// TestBarrierOrdersWholePipe: a schema-change record reaches the sink
// after every record enqueued before it and before every record after it,
// whatever their keys — while one key's record before it is retried as an
// outbox row, the barrier itself fails twice (held whole, not left as a
// row that later segments pass), and, for a RENAME, the old name's pipe
// still retries a record older than it. Every record is delivered once.
func TestBarrierOrdersWholePipe(t *testing.T) {
	st := newTestState(t)
	const pipe, oldPipe = "a:app.users:seg", "a:app.old:seg"
	s := NewStore(st.db, st.schema, zaptest.NewLogger(t))
	ctx := context.Background()
	var items []Pending
	for i := range 10 {
		items = append(items, gtidItem(pipe, 1, i))
	}
	oldItem := gtidItem(oldPipe, 1, 20) // of the table before its rename
	items = append(items, oldItem, ddlItem(pipe, 2, ""))
	for i := range 10 {
		items = append(items, gtidItem(pipe, 3, i))
	}
	// One Enqueue: the barrier must still get a segment of its own.
	if _, err := s.Enqueue(ctx, "r1", Fence{}, items, nil); err != nil {
		t.Fatal(err)
	}
	items = []Pending{ddlItem(pipe, 4, "old")}
	for i := range 5 {
		items = append(items, gtidItem(pipe, 5, i))
	}
	if _, err := s.Enqueue(ctx, "r1", Fence{}, items, nil); err != nil {
		t.Fatal(err)
	}
	if n := count(t, st.db, "SELECT COUNT(*) FROM `"+st.schema+"`.segments WHERE pipe = ? AND records = 1", pipe); n != 2 {
		t.Fatalf("%d one-record segments in %s, want one per schema-change record (2)", n, pipe)
	}

	sink := newScriptedSink(t, st, func(ck string, attempt int) error {
		if ck == "g:0-1-1:3" && attempt <= 3 || ck == "s:0-1-2:0" && attempt <= 2 || ck == oldItem.ChangeKey && attempt <= 7 {
			return errors.New("503 from the receiver")
		}
		return nil
	})
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: sink.fake(), Concurrency: 4, BatchSize: 3}, oldPipe: {Sink: sink.fake()}}, nil)
	stop := wait.Background(t, 30*time.Second, d.Run)
	waitFor(t, "every record delivered", func() bool { return len(sink.delivered()) == 28 })
	stop()

	order := sink.delivered()
	pos := positions(t, order)
	for ck, i := range pos {
		var txn, row int
		if _, err := fmt.Sscanf(ck, "g:0-1-%d:%d", &txn, &row); err != nil || row == 20 {
			continue
		}
		if txn == 1 && i > pos["s:0-1-2:0"] || txn == 3 && i < pos["s:0-1-2:0"] {
			t.Errorf("%s delivered at %d, the ALTER at %d: not in order with it", ck, i, pos["s:0-1-2:0"])
		}
		if txn < 5 && i > pos["s:0-1-4:0"] || txn == 5 && i < pos["s:0-1-4:0"] {
			t.Errorf("%s delivered at %d, the RENAME at %d: not in order with it", ck, i, pos["s:0-1-4:0"])
		}
	}
	if pos[oldItem.ChangeKey] > pos["s:0-1-4:0"] {
		t.Errorf("the old table's record went at %d, after the RENAME at %d", pos[oldItem.ChangeKey], pos["s:0-1-4:0"])
	}
	if got := sink.attemptsOf("s:0-1-2:0"); got != 3 {
		t.Errorf("the ALTER was tried %d times, want 3 (two failures)", got)
	}
	if n := count(t, st.db, "SELECT COUNT(*) FROM `"+st.schema+"`.outbox WHERE op = 's'"); n != 0 {
		t.Errorf("%d schema-change records left their segments as rows; a barrier must wait whole", n)
	}
	if !slices.Contains(order, "g:0-1-1:3") {
		t.Error("the retried row was never delivered")
	}
}

// txItem is a transaction record for pipe (the sink's BEGIN or END
// pipe); an END counts one change of each of tables ("db.table").
func txItem(pipe string, txn int, status string, tables ...string) Pending {
	r := &canonical.TxRecord{ID: fmt.Sprint("0-1-", txn), Status: status}
	if status == canonical.TxEnd {
		r.EventCount, r.Tables = len(tables), map[string]int{}
		for _, t := range tables {
			r.Tables[t] = 1
		}
	}
	c := &canonical.Change{Op: canonical.OpTransaction, Key: canonical.Row{"instance": "a"}, TsMs: 1_700_000_000_456,
		Tx:     r,
		Source: canonical.Source{Connector: "cdcout", DB: canonical.HeartbeatDB, Table: canonical.TransactionTable, GTID: fmt.Sprint("0-1-", txn)}}
	return Pending{Pipe: pipe, Sink: sinkOf(pipe), Change: c, ChangeKey: fmt.Sprintf("t:0-1-%d:%s", txn, status), Digest: canonical.DigestChange(pipe, c)}
}

// TestTransactionRecordsWaitForChanges: a segment of END records is
// delivered only once the pipes of the tables it counts have delivered
// every record older than it (an END after its changes), while a change
// of the transaction is retried as a row; a BEGIN that fails for good is
// dead and does not hold its END forever.
func TestTransactionRecordsWaitForChanges(t *testing.T) {
	st := newTestState(t)
	const data, beginPipe, endPipe = "a:app.users:seg", "a:__cdcout.transaction_begin:seg", "a:__cdcout.transaction:seg"
	s := NewStore(st.db, st.schema, zaptest.NewLogger(t))
	items := []Pending{txItem(beginPipe, 1, "BEGIN")}
	for i := range 6 {
		items = append(items, gtidItem(data, 1, i))
	}
	items = append(items, txItem(endPipe, 1, "END", "app.users"), txItem(beginPipe, 2, "BEGIN"), txItem(endPipe, 2, "END", "app.users"))
	if _, err := s.Enqueue(context.Background(), "r1", Fence{}, items, nil); err != nil {
		t.Fatal(err)
	}
	fake := newScriptedSink(t, st, func(ck string, attempt int) error {
		switch {
		case ck == "g:0-1-1:4" && attempt <= 3:
			return errors.New("503 from the receiver")
		case ck == "t:0-1-2:BEGIN":
			return sink.Permanent(errors.New("400 bad record"))
		}
		return nil
	})
	d := st.drainer(t, "d1", map[string]PipeConfig{data: {Sink: fake.fake(), Concurrency: 4, BatchSize: 3},
		beginPipe: {Sink: fake.fake()}, endPipe: {Sink: fake.fake()}}, nil)
	stop := wait.Background(t, 30*time.Second, d.Run)
	waitFor(t, "every record delivered or dead", func() bool {
		for _, r := range records(t, st.db, st.schema) {
			if r.Status == StatusPending {
				return false
			}
		}
		return true
	})
	stop()
	order := fake.delivered()
	end := slices.Index(order, "t:0-1-1:END")
	for i := range 6 {
		if j := slices.Index(order, fmt.Sprintf("g:0-1-1:%d", i)); j < 0 || j > end {
			t.Errorf("change %d delivered at %d, the END at %d", i, j, end)
		}
	}
	if !slices.Contains(order, "t:0-1-2:END") {
		t.Errorf("the record after the dead one was never delivered: %v", order)
	}
}

// TestTransactionBeginBeforeChanges: with transactions on, no change of
// a transaction reaches the sink before its BEGIN was acknowledged, and
// its END comes after all of them and after its BEGIN — while the first
// BEGIN fails twice (held, with backoff), others are slow (one whose
// changes share a segment with an earlier transaction's, one whose only
// change is dead at enqueue, so only the BEGIN holds its END), a change
// is retried as a row, a third pipe's rows without a transaction
// (backfill-like) lie between the transactions' records in the batches,
// and a huge transaction comes in two enqueues, its BEGIN with the first.
// BEGINs keep their commit order, ENDs theirs. Nothing waits forever (the
// deadline of waitFor): every wait is for older records.
func TestTransactionBeginBeforeChanges(t *testing.T) {
	st := newTestState(t)
	const a, b, bf = "a:app.users:seg", "a:app.orders:seg", "a:app.items:seg"
	const beginPipe, endPipe = "a:__cdcout.transaction_begin:seg", "a:__cdcout.transaction:seg"
	s := NewStore(st.db, st.schema, zaptest.NewLogger(t))
	n := 0
	rows := func(pipe string, txn, from, to int) []Pending {
		var out []Pending
		for i := from; i < to; i++ {
			it := gtidItem(pipe, txn, i)
			if pipe == bf { // not of a transaction
				n++
				it.ChangeKey = fmt.Sprintf("b:1:%04d", n)
			}
			out = append(out, it)
		}
		return out
	}
	begin := func(txn int) []Pending { return []Pending{txItem(beginPipe, txn, "BEGIN")} }
	end := func(txn int, tables ...string) []Pending { return []Pending{txItem(endPipe, txn, "END", tables...)} }
	dead := gtidItem(b, 5, 0)
	dead.Dead = "too large for the sink"
	var batch1, batch2, batch3 []Pending
	for _, part := range [][]Pending{
		begin(1), rows(a, 1, 0, 3), rows(bf, 0, 0, 2), rows(b, 1, 3, 5), end(1, "app.users", "app.orders"),
		rows(bf, 0, 0, 2),
		begin(2), rows(a, 2, 0, 4), rows(bf, 0, 0, 1), rows(b, 2, 4, 5), end(2, "app.users", "app.orders"),
		begin(3), rows(a, 3, 0, 10), // the huge transaction's first part
	} {
		batch1 = append(batch1, part...)
	}
	for _, part := range [][]Pending{
		rows(a, 3, 10, 20), rows(b, 3, 20, 25), rows(bf, 0, 0, 2), end(3, "app.users", "app.orders"),
		begin(4), rows(b, 4, 0, 1), end(4, "app.orders"),
	} {
		batch2 = append(batch2, part...)
	}
	// Alone in its enqueue, so no other record shares its BEGIN's or END's
	// segment.
	batch3 = slices.Concat(begin(5), []Pending{dead}, end(5, "app.orders"))
	for _, items := range [][]Pending{batch1, batch2, batch3} {
		if _, err := s.Enqueue(context.Background(), "r1", Fence{}, items, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Changes are not cut per transaction: one segment per pipe and enqueue.
	if n := count(t, st.db, "SELECT COUNT(*) FROM `"+st.schema+"`.segments WHERE pipe = ?", a); n != 2 {
		t.Errorf("%d segments of %s, want 2 (one per enqueue, holding several transactions)", n, a)
	}

	fake := newScriptedSink(t, st, func(ck string, attempt int) error {
		if ck == "t:0-1-1:BEGIN" && attempt <= 2 || ck == "g:0-1-2:1" && attempt == 1 {
			return errors.New("503 from the receiver")
		}
		return nil
	})
	fake.slow = func(ck string) time.Duration {
		switch ck {
		case "t:0-1-3:BEGIN", "t:0-1-4:BEGIN", "t:0-1-5:BEGIN":
			return 150 * time.Millisecond
		}
		return 0
	}
	pipes := map[string]PipeConfig{beginPipe: {Sink: fake.fake()}, endPipe: {Sink: fake.fake()}}
	for _, p := range []string{a, b, bf} {
		pipes[p] = PipeConfig{Sink: fake.fake(), Concurrency: 4, BatchSize: 3, Transactions: true}
	}
	d := st.drainer(t, "d1", pipes, nil)
	stop := wait.Background(t, 30*time.Second, d.Run)
	want := 0
	for _, r := range records(t, st.db, st.schema) {
		if r.Status != StatusDead {
			want++
		}
	}
	waitFor(t, "every record delivered", func() bool { return len(fake.delivered()) >= want })
	stop()

	order := fake.delivered()
	pos := positions(t, order)
	for ck, i := range pos {
		var txn, row int
		if _, err := fmt.Sscanf(ck, "g:0-1-%d:%d", &txn, &row); err != nil {
			continue
		}
		begin, end := pos[fmt.Sprintf("t:0-1-%d:BEGIN", txn)], pos[fmt.Sprintf("t:0-1-%d:END", txn)]
		if i < begin || i > end {
			t.Errorf("change %s delivered at %d, its BEGIN at %d, its END at %d", ck, i, begin, end)
		}
	}
	for txn := 1; txn <= 5; txn++ {
		b, e := pos[fmt.Sprintf("t:0-1-%d:BEGIN", txn)], pos[fmt.Sprintf("t:0-1-%d:END", txn)]
		if b > e {
			t.Errorf("transaction %d: BEGIN delivered at %d, after its END at %d", txn, b, e)
		}
		if txn > 1 && b < pos[fmt.Sprintf("t:0-1-%d:BEGIN", txn-1)] || txn > 1 && e < pos[fmt.Sprintf("t:0-1-%d:END", txn-1)] {
			t.Errorf("transaction %d's BEGIN or END delivered before transaction %d's: %v", txn, txn-1, order)
		}
	}
	if got := fake.attemptsOf("t:0-1-1:BEGIN"); got != 3 {
		t.Errorf("the first BEGIN was tried %d times, want 3 (two failures)", got)
	}
}

// TestTransactionWaitsWokenInProcess: a sink's changes wait for its
// BEGINs and its ENDs for the changes, so the pipes must wake each other
// when their records are acknowledged, or each step waits for the poll.
// Here every pipe has a Drainer of its own, as in the engine, sharing one
// Wakes, and no pipe polls (an hour): 30 transactions over two tables are
// delivered, in order, only through the wake-ups.
func TestTransactionWaitsWokenInProcess(t *testing.T) {
	st := newTestState(t)
	const a, b = "a:app.users:seg", "a:app.orders:seg"
	const beginPipe, endPipe = "a:__cdcout.transaction_begin:seg", "a:__cdcout.transaction:seg"
	s := NewStore(st.db, st.schema, zaptest.NewLogger(t))
	for batch := range 3 {
		var items []Pending
		for txn := batch*10 + 1; txn <= batch*10+10; txn++ {
			items = append(items, txItem(beginPipe, txn, "BEGIN"), gtidItem(a, txn, 0), gtidItem(b, txn, 1), txItem(endPipe, txn, "END", "app.users", "app.orders"))
		}
		if _, err := s.Enqueue(context.Background(), "r1", Fence{}, items, nil); err != nil {
			t.Fatal(err)
		}
	}
	fake := newScriptedSink(t, st, func(string, int) error { return nil })
	wakes := NewWakes()
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, pipe := range []string{beginPipe, endPipe, a, b} {
		d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: fake.fake(), Transactions: true}},
			func(c *DrainerConfig) { c.Wakes = wakes })
		d.segmentPoll = time.Hour
		wg.Add(1)
		go func() { defer wg.Done(); d.Run(runCtx) }()
	}
	start := time.Now()
	waitFor(t, "every record delivered through wake-ups", func() bool { return len(fake.delivered()) == 4*30 })
	took := time.Since(start)
	cancel()
	wg.Wait()
	pos := positions(t, fake.delivered())
	for txn := 1; txn <= 30; txn++ {
		begin, end := pos[fmt.Sprintf("t:0-1-%d:BEGIN", txn)], pos[fmt.Sprintf("t:0-1-%d:END", txn)]
		for _, ck := range []string{fmt.Sprintf("g:0-1-%d:0", txn), fmt.Sprintf("g:0-1-%d:1", txn)} {
			if i := pos[ck]; i < begin || i > end {
				t.Errorf("change %s delivered at %d, its BEGIN at %d, its END at %d", ck, i, begin, end)
			}
		}
	}
	t.Logf("30 transactions in %v (%.0f/s)", took, 30/took.Seconds())
}

// TestTransactionSegmentsOfEarlierVersionsDrain: segments written before
// BEGINs had a pipe of their own (BEGIN, END, BEGIN, END in one segment
// of the transaction pipe, now the END pipe; one data segment spanning
// them) neither wait for each other nor lose the END's order: the changes
// go first, the records after. A transaction written after them, in the
// BEGIN and END pipes, keeps its order behind them.
func TestTransactionSegmentsOfEarlierVersionsDrain(t *testing.T) {
	st := newTestState(t)
	const a, beginPipe, txPipe = "a:app.users:seg", "a:__cdcout.transaction_begin:seg", "a:__cdcout.transaction:seg"
	s := NewStore(st.db, st.schema, zaptest.NewLogger(t))
	items := []Pending{txItem(txPipe, 1, "BEGIN"), gtidItem(a, 1, 0), gtidItem(a, 1, 1), txItem(txPipe, 1, "END", "app.users"),
		txItem(txPipe, 2, "BEGIN"), gtidItem(a, 2, 0), txItem(txPipe, 2, "END", "app.users")}
	if _, err := s.Enqueue(context.Background(), "r1", Fence{}, items, nil); err != nil {
		t.Fatal(err)
	}
	for _, pipe := range []string{a, txPipe} {
		st.mergeSegments(t, pipe)
	}
	later := []Pending{txItem(beginPipe, 3, "BEGIN"), gtidItem(a, 3, 0), txItem(txPipe, 3, "END", "app.users")}
	if _, err := s.Enqueue(context.Background(), "r1", Fence{}, later, nil); err != nil {
		t.Fatal(err)
	}
	fake := newScriptedSink(t, st, func(string, int) error { return nil })
	fake.slow = func(ck string) time.Duration {
		if ck == "t:0-1-3:BEGIN" {
			return 100 * time.Millisecond
		}
		return 0
	}
	d := st.drainer(t, "d1", map[string]PipeConfig{a: {Sink: fake.fake(), Transactions: true},
		beginPipe: {Sink: fake.fake(), Transactions: true}, txPipe: {Sink: fake.fake(), Transactions: true}}, nil)
	stop := wait.Background(t, 30*time.Second, d.Run)
	waitFor(t, "every record delivered", func() bool { return len(fake.delivered()) == len(items)+len(later) })
	stop()
	order := fake.delivered()
	for _, ck := range []string{"g:0-1-1:0", "g:0-1-1:1", "g:0-1-2:0"} {
		if slices.Index(order, ck) > slices.Index(order, "t:0-1-1:BEGIN") {
			t.Errorf("delivered %v: the old segment of transaction records must follow the one of changes it spans", order)
			break
		}
	}
	if i := slices.Index(order, "g:0-1-3:0"); i < slices.Index(order, "t:0-1-3:BEGIN") || i > slices.Index(order, "t:0-1-3:END") ||
		slices.Index(order, "t:0-1-3:END") < slices.Index(order, "t:0-1-2:END") {
		t.Errorf("delivered %v: the later transaction out of its order", order)
	}
}

// mergeSegments makes the pipe's pending segments one, as enqueues wrote
// them before transaction records were alone in theirs.
func (s *testState) mergeSegments(t *testing.T, pipe string) {
	t.Helper()
	seg := "`" + s.schema + "`.segments"
	rows, err := s.db.Query("SELECT payload FROM "+seg+" WHERE pipe = ? AND status = 'pending' ORDER BY id", pipe)
	if err != nil {
		t.Fatal(err)
	}
	var recs []*segRecord
	for rows.Next() {
		var payload []byte
		if err := rows.Scan(&payload); err != nil {
			t.Fatal(err)
		}
		parsed, err := parseSegment(payload)
		if err != nil {
			t.Fatal(err)
		}
		for i := range parsed {
			recs = append(recs, &parsed[i])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	s.exec(t, "DELETE FROM "+seg+" WHERE pipe = ?", pipe)
	s.exec(t, "INSERT INTO "+seg+" (id, pipe, sink, records, last_id, first_commit_ts, payload) VALUES (?,?,?,?,?,?,?)",
		recs[0].id, pipe, PipeSink(pipe), len(recs), recs[len(recs)-1].id, recs[0].commitTS, appendSegment(nil, recs, SegmentFormat1))
}

// scriptedSink answers each attempt at a record as fail says for its
// change key and attempt number (1-based; nil delivers it) and logs the
// change keys delivered, in order, over every pipe it serves.
type scriptedSink struct {
	fail      func(changeKey string, attempt int) error
	changeKey map[string]string // record id → change key
	// slow, when set, is how long a call with the record takes, outside
	// the lock (other pipes' calls go on meanwhile).
	slow func(changeKey string) time.Duration

	mu       sync.Mutex
	order    []string
	attempts map[string]int
}

// newScriptedSink scripts a sink for the records st holds now.
func newScriptedSink(t *testing.T, st *testState, fail func(changeKey string, attempt int) error) *scriptedSink {
	s := &scriptedSink{fail: fail, changeKey: map[string]string{}, attempts: map[string]int{}}
	for _, r := range records(t, st.db, st.schema) {
		s.changeKey[r.ID] = r.ChangeKey
	}
	return s
}

func (s *scriptedSink) fake() fakeSink {
	return fakeSink{fn: func(_ context.Context, recs []Record) []error {
		if s.slow != nil {
			for _, r := range recs {
				time.Sleep(s.slow(s.changeKey[r.ID]))
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		errs := make([]error, len(recs))
		for i, r := range recs {
			ck := s.changeKey[r.ID]
			s.attempts[ck]++
			if errs[i] = s.fail(ck, s.attempts[ck]); errs[i] == nil {
				s.order = append(s.order, ck)
			}
		}
		return errs
	}}
}

// delivered returns the change keys delivered so far, in order.
func (s *scriptedSink) delivered() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

func (s *scriptedSink) attemptsOf(changeKey string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts[changeKey]
}

// positions maps each change key of order to its place in it, failing t
// for a key delivered twice.
func positions(t *testing.T, order []string) map[string]int {
	t.Helper()
	pos := map[string]int{}
	for i, ck := range order {
		if _, dup := pos[ck]; dup {
			t.Errorf("%s delivered twice", ck)
		}
		pos[ck] = i
	}
	return pos
}
