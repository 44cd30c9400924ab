package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/sink"
	"github.com/cdcout/cdcout/state"
)

// enqueueTxns enqueues txns transactions of keys changes each (key i of
// every transaction is row id i) for pipe, one Enqueue (one segment) per
// transaction, and returns the change keys per row key in commit order.
func enqueueTxns(t *testing.T, st *testState, pipe string, txns, keys int) map[string][]string {
	t.Helper()
	return enqueueTxnsFormat(t, st, pipe, txns, keys, SegmentFormat1)
}

// enqueueTxnsFormat is enqueueTxns writing segments in the given format.
func enqueueTxnsFormat(t *testing.T, st *testState, pipe string, txns, keys, format int) map[string][]string {
	t.Helper()
	return enqueueTxnRange(t, st, pipe, 1, txns, keys, format)
}

// enqueueTxnRange is enqueueTxnsFormat of the transactions numbered from
// first on.
func enqueueTxnRange(t *testing.T, st *testState, pipe string, first, txns, keys, format int) map[string][]string {
	t.Helper()
	return enqueueTxnsWith(t, NewStore(st.db, st.schema, zaptest.NewLogger(t)).WithSegmentFormat(format), pipe, first, txns, keys)
}

// enqueueTxnsWith is enqueueTxnRange through the Store s.
func enqueueTxnsWith(t *testing.T, s *Store, pipe string, first, txns, keys int) map[string][]string {
	t.Helper()
	order := map[string][]string{}
	for txn := first; txn < first+txns; txn++ {
		var items []Pending
		for i := 0; i < keys; i++ {
			it := gtidItem(pipe, txn, i)
			items = append(items, it)
			k := fmt.Sprintf(`{"id":%d}`, i)
			order[k] = append(order[k], it.ChangeKey)
		}
		if _, err := s.Enqueue(context.Background(), "r1", Fence{}, items, nil); err != nil {
			t.Fatal(err)
		}
	}
	return order
}

// deliveryLog records successful deliveries per key, and fails records as
// fail says.
type deliveryLog struct {
	mu       sync.Mutex
	byKey    map[string][]string // key → change keys (from the ids' records) in delivery order
	idToKey  map[string]string
	attempts map[string]int
	fail     func(r Record, attempt int) error
}

func (l *deliveryLog) sink() fakeSink {
	return fakeSink{fn: func(_ context.Context, recs []Record) []error {
		l.mu.Lock()
		defer l.mu.Unlock()
		errs := make([]error, len(recs))
		seen := map[string]bool{}
		for i, r := range recs {
			if seen[r.Key] {
				errs[i] = errors.New("two records of one key in one call")
				continue
			}
			seen[r.Key] = true
			l.attempts[r.ID]++
			if l.fail != nil {
				if err := l.fail(r, l.attempts[r.ID]); err != nil {
					errs[i] = err
					continue
				}
			}
			l.byKey[r.Key] = append(l.byKey[r.Key], r.ID)
		}
		return errs
	}}
}

func newDeliveryLog() *deliveryLog {
	return &deliveryLog{byKey: map[string][]string{}, idToKey: map[string]string{}, attempts: map[string]int{}}
}

// A pipe's segments are delivered with every key in commit order, while
// one key fails for a while and another's first record is dead-lettered:
// the failing records and the later records of their keys leave their
// segments as outbox rows, the rest of the segments are done, and every
// record ends delivered exactly as often as it must, except the dead one.
// In segment format 2 the key hashes that keep a key's later records
// behind its pending row are computed on read, and must be the rows'.
func TestSegmentsKeepKeyOrderAroundFailures(t *testing.T) {
	for _, format := range []int{SegmentFormat1, SegmentFormat2} {
		t.Run(fmt.Sprint("format", format), func(t *testing.T) { testSegmentsKeepKeyOrderAroundFailures(t, format) })
	}
}

func testSegmentsKeepKeyOrderAroundFailures(t *testing.T, format int) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	order := enqueueTxnsFormat(t, st, pipe, 6, 30, format)
	var version []byte
	if err := st.db.QueryRow("SELECT payload FROM " + state.Table(st.schema, "segments") + " ORDER BY id LIMIT 1").Scan(&version); err != nil {
		t.Fatal(err)
	}
	plain, err := s2.Decode(nil, version[1:])
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]byte{SegmentFormat1: segmentVersion, SegmentFormat2: segmentVersion2}[format]; plain[0] != want {
		t.Fatalf("segment written in version %d, want %d", plain[0], want)
	}
	recs := records(t, st.db, st.schema)
	idOf := map[string]string{}
	for _, r := range recs {
		idOf[r.ChangeKey] = r.ID
	}
	deadKey := `{"id":5}`
	deadID := idOf[order[deadKey][0]]
	log := newDeliveryLog()
	log.fail = func(r Record, attempt int) error {
		switch {
		case r.Key == `{"id":3}` && attempt <= 2:
			return errors.New("503 from the receiver")
		case r.ID == deadID:
			return sink.Permanent(errors.New("400 bad record"))
		}
		return nil
	}
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: log.sink(), Concurrency: 4, BatchSize: 7}}, nil)
	stop := wait.Background(t, 30*time.Second, d.Run)
	waitFor(t, "every record delivered or dead", func() bool {
		for _, r := range records(t, st.db, st.schema) {
			if r.Status == "pending" {
				return false
			}
		}
		return true
	})
	stop()

	for key, changeKeys := range order {
		var want []string
		for _, ck := range changeKeys {
			if idOf[ck] != deadID {
				want = append(want, idOf[ck])
			}
		}
		if got := log.byKey[key]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("key %s delivered %v, want %v (commit order, once each)", key, got, want)
		}
	}
	final := records(t, st.db, st.schema)
	if len(final) != 6*30 {
		t.Fatalf("%d records, want %d", len(final), 6*30)
	}
	rows := map[string]StoredRecord{}
	for _, r := range final {
		switch {
		case r.ID == deadID:
			if r.Status != "dead" || r.InSegment != "" {
				t.Fatalf("dead-lettered record = %+v, want a dead outbox row", r)
			}
		case r.Status != "delivered":
			t.Fatalf("record %s (key %s) is %s", r.ID, r.Key, r.Status)
		}
		if r.InSegment == "" {
			rows[r.ID] = r
		}
	}
	// Key 3 failed twice in the first segment: its records there and in
	// every later segment delivered while its row was pending are rows.
	if r, ok := rows[idOf[order[`{"id":3}`][0]]]; !ok || r.Status != "delivered" {
		t.Fatalf("key 3's failing record is not a delivered row: %+v", r)
	}
	for id, r := range rows {
		if r.Key != `{"id":3}` && r.Key != deadKey {
			t.Fatalf("record %s of key %s became a row; only failing keys' records should", id, r.Key)
		}
	}
	if n := st.count(t, "SELECT COUNT(*) FROM "+state.Table(st.schema, "segments")+" WHERE status <> 'done'"); n != 0 {
		t.Fatalf("%d segments not done", n)
	}
	hashes, err := st.db.Query("SELECT row_key, key_hash FROM " + state.Table(st.schema, "outbox"))
	if err != nil {
		t.Fatal(err)
	}
	defer hashes.Close()
	for hashes.Next() {
		var key, hash string
		if err := hashes.Scan(&key, &hash); err != nil {
			t.Fatal(err)
		}
		if hash != keyHash(key) {
			t.Fatalf("row of key %s left its segment with key hash %s, want %s", key, hash, keyHash(key))
		}
	}
	if err := hashes.Err(); err != nil {
		t.Fatal(err)
	}
	if n := st.count(t, "SELECT COUNT(*) FROM {attempts} WHERE outbox_id = ?", idOf[order[`{"id":3}`][0]]); n != 3 {
		t.Fatalf("attempt log of the retried record has %d entries, want 3 (two failures, one success)", n)
	}
}

// A segment claimed by a drainer that stops answering is taken by another
// once the claim lapses; the first drainer's late outcome changes nothing.
func TestSegmentClaimLapsesAndIsRetaken(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	enqueueTxns(t, st, pipe, 1, 10)
	mod := func(c *DrainerConfig) { c.ClaimLease = 300 * time.Millisecond }
	pc := PipeConfig{Sink: okSink(), Timeout: 100 * time.Millisecond}
	a := st.drainer(t, "a", map[string]PipeConfig{pipe: pc}, mod)
	b := st.drainer(t, "b", map[string]PipeConfig{pipe: pc}, mod)
	seg, err := a.pipes[0].claimSegment(context.Background())
	if err != nil || seg == nil || len(seg.recs) != 10 {
		t.Fatalf("claim = %+v, %v; want the 10-record segment", seg, err)
	}
	if n, err := b.DrainOnce(context.Background()); err != nil || n != 0 {
		t.Fatalf("second drainer took %d records (%v) of a segment claimed by another", n, err)
	}
	time.Sleep(400 * time.Millisecond)
	if n, err := b.DrainOnce(context.Background()); err != nil || n != 10 {
		t.Fatalf("after the claim lapsed the second drainer delivered %d (%v), want 10", n, err)
	}
	// a's late outcome, with a record it thinks failed, matches nothing.
	left := []leftRecord{{rec: &seg.recs[0], attempt: 1, status: "pending", errText: "late"}}
	if ok, err := a.pipes[0].recordSegment(context.Background(), seg, left, nil); err != nil || ok {
		t.Fatalf("stale drainer's outcome: recorded %v, %v; want nothing recorded", ok, err)
	}
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox}"); n != 0 {
		t.Fatalf("the stale drainer wrote %d outbox rows", n)
	}
	for _, r := range records(t, st.db, st.schema) {
		if r.Status != "delivered" {
			t.Fatalf("record %s is %s", r.ID, r.Status)
		}
	}
}

// With drain leases, a segment is claimed only while the lease row in the
// database names this drainer with the same epoch.
func TestSegmentClaimFencedByDrainLease(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	enqueueTxns(t, st, pipe, 1, 5)
	held := lease.Lease{Name: "drain/" + pipe, Holder: "d1", Epoch: 3, LocalDeadline: time.Now().Add(time.Hour)}
	mod := func(c *DrainerConfig) {
		c.Leases = func(string) (lease.Lease, bool) { return held, true }
	}
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: okSink()}}, mod)
	grantLease(t, st.db, st.schema, held.Name, "d1", 4, time.Hour) // taken over: epoch 4
	if n, err := d.DrainOnce(context.Background()); err != nil || n != 0 {
		t.Fatalf("fenced-out drainer delivered %d (%v)", n, err)
	}
	grantLease(t, st.db, st.schema, held.Name, "d1", 3, time.Hour)
	if n, err := d.DrainOnce(context.Background()); err != nil || n != 5 {
		t.Fatalf("lease holder delivered %d (%v), want 5", n, err)
	}
}

// A stop in the middle of a segment hands its undelivered records to the
// row drainer: nothing is lost and nothing is delivered twice.
func TestSegmentStopLeavesRestAsRows(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	enqueueTxns(t, st, pipe, 1, 40)
	ctx, cancel := context.WithCancel(context.Background())
	var calls sync.Map
	slow := fakeSink{fn: func(_ context.Context, recs []Record) []error {
		for _, r := range recs {
			if _, dup := calls.LoadOrStore(r.ID, true); dup {
				panic("delivered twice: " + r.ID)
			}
		}
		cancel() // stop after the first call
		return make([]error, len(recs))
	}}
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: slow, Concurrency: 1, BatchSize: 10}}, nil)
	// Two rounds are needed at least: 40 keys, 10 per call, one call at a
	// time, and the stop comes after the first call.
	d.pipes[0].drainSegment(ctx)
	rows := st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status = 'pending' AND attempts = 0")
	if rows != 30 {
		t.Fatalf("%d records left as rows, want 30 (40 minus the 10 of the one call before the stop)", rows)
	}
	d2 := st.drainer(t, "d2", map[string]PipeConfig{pipe: {Sink: fakeSink{fn: func(_ context.Context, recs []Record) []error {
		for _, r := range recs {
			if _, dup := calls.LoadOrStore(r.ID, true); dup {
				panic("delivered twice: " + r.ID)
			}
		}
		return make([]error, len(recs))
	}}}}, nil)
	drainUntil(t, d2, "all rows delivered", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status = 'pending'") == 0
	})
	n := 0
	calls.Range(func(any, any) bool { n++; return true })
	if n != 40 {
		t.Fatalf("%d records delivered, want 40", n)
	}
}

// A sink that fails every record (an outage) leaves its segments whole:
// they wait out a backoff and are tried again, no record becomes a row, and
// everything is delivered once the sink is back.
func TestSegmentHeldWholeDuringOutage(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	enqueueTxns(t, st, pipe, 3, 20)
	var down atomic.Bool
	down.Store(true)
	var failedCalls atomic.Int64
	log := newDeliveryLog()
	log.fail = func(Record, int) error {
		if down.Load() {
			failedCalls.Add(1)
			return errors.New("503 service unavailable")
		}
		return nil
	}
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: log.sink(), MaxAttempts: 50}}, nil)
	stop := wait.Background(t, 30*time.Second, d.Run)
	waitFor(t, "three attempts during the outage", func() bool { return failedCalls.Load() >= 3*20 })
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox}"); n != 0 {
		t.Fatalf("%d outbox rows during an outage, want the segments held whole", n)
	}
	var lastErr sql.NullString
	var attempts int
	if err := st.db.QueryRow("SELECT last_error, attempts FROM "+state.Table(st.schema, "segments")+" ORDER BY id LIMIT 1").Scan(&lastErr, &attempts); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErr.String, "503") || attempts < 3 {
		t.Fatalf("held segment: last_error %q, attempts %d; want the 503 and at least 3 attempts", lastErr.String, attempts)
	}
	down.Store(false)
	waitFor(t, "every record delivered after the outage", func() bool {
		for _, r := range records(t, st.db, st.schema) {
			if r.Status != "delivered" {
				return false
			}
		}
		return true
	})
	stop()
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox}"); n != 0 {
		t.Fatalf("%d outbox rows, want none", n)
	}
	for key, ids := range log.byKey {
		if len(ids) != 3 {
			t.Fatalf("key %s delivered %d times, want 3 (once per transaction)", key, len(ids))
		}
	}
}

// A drainer that loses its drain lease between claiming a segment and
// sending any of it gives the segment back unchanged: no record becomes a
// row, and the next holder delivers it.
func TestSegmentReleasedWhenLeaseLostBeforeSending(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	enqueueTxns(t, st, pipe, 1, 5)
	held := lease.Lease{Name: "drain/" + pipe, Holder: "d1", Epoch: 1, LocalDeadline: time.Now().Add(time.Hour)}
	grantLease(t, st.db, st.schema, held.Name, "d1", 1, time.Hour)
	var calls atomic.Int64
	sent := atomic.Int64{}
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: fakeSink{fn: func(_ context.Context, recs []Record) []error {
		sent.Add(int64(len(recs)))
		return make([]error, len(recs))
	}}}}, func(c *DrainerConfig) {
		c.Leases = func(string) (lease.Lease, bool) {
			return held, calls.Add(1) == 1 // valid for the claim only
		}
	})
	if n, err := d.pipes[0].drainSegment(context.Background()); err != nil || n != 0 || sent.Load() != 0 {
		t.Fatalf("drainSegment = %d, %v, %d sent; want nothing sent", n, err, sent.Load())
	}
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox}"); n != 0 {
		t.Fatalf("%d outbox rows, want the segment given back whole", n)
	}
	var claimer int64
	var status string
	if err := st.db.QueryRow("SELECT claimer, status FROM "+state.Table(st.schema, "segments")).Scan(&claimer, &status); err != nil || claimer != 0 || status != "pending" {
		t.Fatalf("segment claimer %d status %s (%v), want released and pending", claimer, status, err)
	}
	d2 := st.drainer(t, "d2", map[string]PipeConfig{pipe: {Sink: okSink()}}, nil)
	if n, err := d2.DrainOnce(context.Background()); err != nil || n != 5 {
		t.Fatalf("next drainer delivered %d (%v), want 5", n, err)
	}
}

// stallingSink delivers every record and records, by key, the GTIDs it
// delivered, in order; the call holding key {"id":0}'s record of 0-1-1
// stalls on that record until free.
type stallingSink struct {
	t       *testing.T
	mu      sync.Mutex
	got     map[string][]string // key → GTIDs delivered, in order
	release chan struct{}
	once    sync.Once
}

func newStallingSink(t *testing.T) *stallingSink {
	return &stallingSink{t: t, got: map[string][]string{}, release: make(chan struct{})}
}

func (s *stallingSink) fake() fakeSink {
	return fakeSink{fn: func(_ context.Context, recs []Record) []error {
		for _, r := range recs {
			gtid := gtidOf(s.t, r)
			if r.Key == `{"id":0}` && gtid == "0-1-1" {
				<-s.release
			}
			s.mu.Lock()
			s.got[r.Key] = append(s.got[r.Key], gtid)
			s.mu.Unlock()
		}
		return nil
	}}
}

// free lets the stalled record go on; it may be called more than once, so
// that a test can also defer it to run before its drainer is stopped.
func (s *stallingSink) free() { s.once.Do(func() { close(s.release) }) }

// A key's next record in a segment goes out as soon as its previous one is
// delivered: one slow record holds its own key's later records, not every
// other key's (delivery in rounds of every key's next record held them all
// until the slow one returned).
func TestSlowRecordHoldsOnlyItsKey(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	const keys, txns = 10, 3
	// One Enqueue: one segment holding three records of every key.
	var items []Pending
	for txn := 1; txn <= txns; txn++ {
		for i := range keys {
			items = append(items, gtidItem(pipe, txn, i))
		}
	}
	if _, err := NewStore(st.db, st.schema, zaptest.NewLogger(t)).Enqueue(context.Background(), "r1", Fence{}, items, nil); err != nil {
		t.Fatal(err)
	}
	snk := newStallingSink(t)
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: snk.fake(), BatchSize: 1, Concurrency: 4}}, nil)
	defer wait.Background(t, 30*time.Second, d.Run)()
	defer snk.free() // before the drainer stops, also when the test fails
	waitFor(t, "every other key's three records delivered while key 0's first is under way", func() bool {
		snk.mu.Lock()
		defer snk.mu.Unlock()
		for i := 1; i < keys; i++ {
			if len(snk.got[fmt.Sprintf(`{"id":%d}`, i)]) != txns {
				return false
			}
		}
		return true
	})
	snk.free()
	waitFor(t, "the segment done", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM "+state.Table(st.schema, "segments")+" WHERE status = 'done'") == 1
	})
	snk.mu.Lock()
	defer snk.mu.Unlock()
	for i := range keys {
		k := fmt.Sprintf(`{"id":%d}`, i)
		if g := strings.Join(snk.got[k], " "); g != "0-1-1 0-1-2 0-1-3" {
			t.Errorf("key %s delivered %s, want 0-1-1 0-1-2 0-1-3 (once each, in order)", k, g)
		}
	}
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox}"); n != 0 {
		t.Errorf("%d outbox rows, want none (nothing failed)", n)
	}
}

// gtidOf is the source GTID in r's envelope.
func gtidOf(t *testing.T, r Record) string {
	t.Helper()
	var env struct {
		Source struct {
			GTID string `json:"gtid"`
		} `json:"source"`
	}
	if err := json.Unmarshal(r.Payload, &env); err != nil {
		t.Error(err)
	}
	return env.Source.GTID
}

// A backlog of segments is delivered with each next segment read while
// the one before it goes out: every segment after the first is claimed as
// read, once, in order. A segment claimed by someone else between the
// read and the claim (its attempts moved) is not claimed as read: the
// loop finds it the usual way and it is delivered once.
func TestSegmentsReadAhead(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	const txns = 8
	order := enqueueTxns(t, st, pipe, txns, 20)
	idOf := map[string]string{}
	for _, r := range records(t, st.db, st.schema) {
		idOf[r.ChangeKey] = r.ID
	}
	log := newDeliveryLog()
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: log.sink(), Concurrency: 4, BatchSize: 7}}, nil)
	drainInOrder(t, st, d, log, order, idOf)
	segments := state.Table(st.schema, "segments")
	if n := d.claimedAhead.Load(); n != txns-1 {
		t.Fatalf("%d segments claimed as read ahead, want %d (all but the first)", n, txns-1)
	}
	if n := st.count(t, "SELECT COUNT(*) FROM "+segments+" WHERE attempts <> 1"); n != 0 {
		t.Fatalf("%d segments with other than one attempt", n)
	}

	// Two more segments; the first is read ahead of, then the second is
	// claimed and given back by another drainer (attempts + 1).
	more := enqueueTxnRange(t, st, pipe, txns+1, 2, 3, SegmentFormat1)
	d2 := st.drainer(t, "d2", map[string]PipeConfig{pipe: {Sink: log.sink()}}, nil)
	p := d2.pipes[0]
	var first string
	if err := st.db.QueryRow("SELECT id FROM " + segments + " WHERE status = 'pending' ORDER BY id LIMIT 1").Scan(&first); err != nil {
		t.Fatal(err)
	}
	next, err := p.readNext(context.Background(), first)
	if err != nil || next == nil {
		t.Fatalf("read ahead after %s: %v, %v", first, next, err)
	}
	if len(next.recs) != 3 || next.more || next.rowsPending {
		t.Fatalf("read ahead %d records, more %v, rows pending %v; want 3, false, false", len(next.recs), next.more, next.rowsPending)
	}
	st.exec(t, "UPDATE "+segments+" SET attempts = attempts + 1 WHERE id = ?", next.id)
	if seg, err := p.claimAhead(context.Background(), lease.Lease{}, false, next); err != nil || seg != nil {
		t.Fatalf("claimed a segment as read after another claimed it: %v, %v", seg, err)
	}
	stop := wait.Background(t, 30*time.Second, d2.Run)
	waitFor(t, "the two new segments done", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM "+segments+" WHERE status <> 'done'") == 0
	})
	stop()
	for key, changeKeys := range more {
		got := log.byKey[key]
		tail := got[len(got)-len(changeKeys):]
		for i, ck := range changeKeys {
			if tail[i] != idOfKey(t, st, ck) {
				t.Fatalf("key %s: last deliveries %v, want the new segments' records %v in order", key, tail, changeKeys)
			}
		}
	}
	if total := len(log.attempts); total != txns*20+2*3 {
		t.Fatalf("%d records delivered, want %d", total, txns*20+2*3)
	}
	for id, n := range log.attempts {
		if n != 1 {
			t.Fatalf("record %s delivered %d times", id, n)
		}
	}
}

// drainInOrder runs d until every segment is done and checks that each
// key's records (order: key → change keys in commit order; idOf: change
// key → record id) were delivered in commit order, once each.
func drainInOrder(t *testing.T, st *testState, d *Drainer, log *deliveryLog, order map[string][]string, idOf map[string]string) {
	t.Helper()
	stop := wait.Background(t, 30*time.Second, d.Run)
	segments := state.Table(st.schema, "segments")
	waitFor(t, "every segment done", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM "+segments+" WHERE status <> 'done'") == 0
	})
	stop()
	for key, changeKeys := range order {
		var want []string
		for _, ck := range changeKeys {
			want = append(want, idOf[ck])
		}
		if got := log.byKey[key]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("key %s delivered %v, want %v (commit order, once each)", key, got, want)
		}
	}
}

// idOfKey is the outbox id of the record with change key ck.
func idOfKey(t *testing.T, st *testState, ck string) string {
	t.Helper()
	for _, r := range records(t, st.db, st.schema) {
		if r.ChangeKey == ck {
			return r.ID
		}
	}
	t.Fatalf("no record of change key %s", ck)
	return ""
}

// What was read ahead is claimed as read only soon after the read and
// under the drain lease it was read under: a drainer that lost its lease
// and took it back may find rows left by another's segments meanwhile,
// which the read said nothing of. Otherwise the segment is found, claimed
// and read again.
func TestStaleReadAheadIsReadAgain(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	enqueueTxns(t, st, pipe, 2, 5)
	log := newDeliveryLog()
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: log.sink()}}, nil)
	p := d.pipes[0]
	next, err := p.readNext(context.Background(), "")
	if err != nil || next == nil {
		t.Fatalf("read ahead: %v, %v", next, err)
	}
	for _, tc := range []struct {
		name  string
		at    time.Time
		epoch uint64
		ahead bool
	}{
		{"fresh", time.Now(), 0, true},
		{"old", time.Now().Add(-2 * aheadMaxAge), 0, false},
		{"another epoch", time.Now(), 7, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st.exec(t, "UPDATE "+state.Table(st.schema, "segments")+" SET claimer = 0, next_attempt_at = NOW(6), attempts = 0")
			seg := *next
			seg.recs = append([]segRecord(nil), next.recs...)
			seg.attempt, seg.readAt, seg.readEpoch = 0, tc.at, tc.epoch
			p.ahead = &seg
			before := d.claimedAhead.Load()
			got, err := p.claimSegment(context.Background())
			if err != nil || got == nil || got.id != next.id {
				t.Fatalf("claim: %v, %v; want segment %s", got, err, next.id)
			}
			if ahead := d.claimedAhead.Load() > before; ahead != tc.ahead {
				t.Fatalf("claimed as read ahead: %v, want %v", ahead, tc.ahead)
			}
			if p.ahead != nil {
				t.Fatal("the read ahead is still kept after the claim")
			}
		})
	}
}
