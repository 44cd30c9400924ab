package outbox

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/state"
)

// Segments this process enqueued are delivered from the payloads kept in
// memory, not read back: with the table's payloads overwritten by garbage
// after the commit, every record is still delivered once, in commit order,
// from memory, and nothing is kept afterwards. A drainer without the
// Recent reads the garbage and stops the pipe, as it must.
func TestSegmentsFromMemory(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:mem"
	const txns, keys = 6, 15
	recent := NewRecent(DefaultRecentBytes)
	s := NewStore(st.db, st.schema, zaptest.NewLogger(t)).WithRecent(recent)
	order := enqueueTxnsWith(t, s, pipe, 1, txns, keys)
	if n, b := recent.Len(); n != txns || b == 0 {
		t.Fatalf("kept %d segments (%d bytes), want %d", n, b, txns)
	}
	idOf := map[string]string{}
	for _, r := range records(t, st.db, st.schema) {
		idOf[r.ChangeKey] = r.ID
	}
	segments := state.Table(st.schema, "segments")
	st.exec(t, "UPDATE "+segments+" SET payload = 'not a segment'")

	// Without the Recent the payload is read, and is refused.
	plain := st.drainer(t, "plain", map[string]PipeConfig{pipe: {Sink: newDeliveryLog().sink()}}, nil)
	if _, err := plain.pipes[0].drainSegment(context.Background()); err == nil {
		t.Fatal("a drainer without the kept payloads delivered a corrupt segment")
	}
	st.exec(t, "UPDATE "+segments+" SET claimer = 0, next_attempt_at = NOW(6) - INTERVAL 1 SECOND")

	log := newDeliveryLog()
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: log.sink(), Concurrency: 4, BatchSize: 7}},
		func(c *DrainerConfig) { c.Recent = recent })
	drainInOrder(t, st, d, log, order, idOf)
	if total := len(log.attempts); total != txns*keys {
		t.Fatalf("%d records delivered, want %d", total, txns*keys)
	}
	if h := recent.Hits(); h != txns {
		t.Fatalf("%d segments read from memory, want %d", h, txns)
	}
	if n, b := recent.Len(); n != 0 || b != 0 {
		t.Fatalf("%d segments (%d bytes) still kept after delivery, want none", n, b)
	}
}

// A kept payload serves only the segment of its id and pipe: a segment
// whose id or pipe differs is read from the table.
func TestRecentServesOnlyItsSegment(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:own"
	enqueueTxns(t, st, pipe, 1, 5)
	var id string
	segments := state.Table(st.schema, "segments")
	if err := st.db.QueryRow("SELECT id FROM " + segments).Scan(&id); err != nil {
		t.Fatal(err)
	}
	recent := NewRecent(DefaultRecentBytes)
	recent.put(id, "a:app.users:other", []byte("garbage of another pipe"))
	recent.put("0", pipe, []byte("garbage of an id before the segment's"))
	log := newDeliveryLog()
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: log.sink()}}, func(c *DrainerConfig) { c.Recent = recent })
	// Reading ahead expects the kept "0" and finds the table's segment.
	next, err := d.pipes[0].readNext(context.Background(), "")
	if err != nil || next == nil || next.id != id || len(next.recs) != 5 {
		t.Fatalf("read ahead: %+v, %v; want segment %s of 5 records from the table", next, err, id)
	}
	if n, err := d.pipes[0].drainSegment(context.Background()); err != nil || n != 5 {
		t.Fatalf("drained %d records, %v; want 5 from the table", n, err)
	}
	if len(log.attempts) != 5 || recent.Hits() != 0 {
		t.Fatalf("%d records delivered, %d read from memory; want 5 and none", len(log.attempts), recent.Hits())
	}
}

// Recent holds at most its limit in bytes, refusing newer segments when
// full (the oldest are the next to be delivered), and drops what it kept
// longer than recentMaxAge.
func TestRecentBounds(t *testing.T) {
	r := NewRecent(100)
	now := time.Unix(1_700_000_000, 0)
	r.now = func() time.Time { return now }
	r.put("s1", "p", make([]byte, 60))
	r.put("s2", "p", make([]byte, 60)) // over the limit: refused
	r.put("s3", "q", make([]byte, 40))
	if n, b := r.Len(); n != 2 || b != 100 {
		t.Fatalf("kept %d segments, %d bytes; want 2, 100", n, b)
	}
	if r.get("p", "s2") != nil || r.get("p", "s1") == nil || r.get("q", "s1") != nil {
		t.Fatal("get: want s1 of p only")
	}
	if s := r.next("p", ""); s == nil || s.id != "s1" {
		t.Fatalf("next of p = %v, want s1", s)
	}
	if s := r.next("p", "s1"); s != nil {
		t.Fatalf("next of p after s1 = %v, want none", s.id)
	}
	r.took(r.get("p", "s1"))
	r.put("s4", "p", make([]byte, 60))
	if n, b := r.Len(); n != 2 || b != 100 || r.get("p", "s4") == nil {
		t.Fatalf("after taking s1: kept %d segments, %d bytes; want s3 and s4 (100 bytes)", n, b)
	}
	now = now.Add(recentMaxAge)
	r.put("s5", "p", make([]byte, 10))
	if n, b := r.Len(); n != 1 || b != 10 || r.get("p", "s5") == nil {
		t.Fatalf("after %v: kept %d segments, %d bytes; want only s5", recentMaxAge, n, b)
	}
	var none *Recent
	none.put("x", "p", []byte("y"))
	if none.get("p", "x") != nil || none.next("p", "") != nil || none.Hits() != 0 {
		t.Fatal("a nil Recent kept something")
	}
}
