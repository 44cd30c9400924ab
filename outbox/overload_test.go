package outbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/sink"
	"github.com/cdcout/cdcout/state"
)

// An overloaded receiver is not the record's fault: a row refused for
// capacity far more often than MaxAttempts is delivered in the end, never
// dead-lettered, and its attempt count holds only the delivery.
func TestOverloadedRowNotCountedNorDead(t *testing.T) {
	s := newTestState(t)
	const pipe = "i:app.t:fake"
	id := s.insert(t, pipe, `[1]`)
	var calls atomic.Int32
	snk := fakeSink{fn: func(_ context.Context, recs []Record) []error {
		if calls.Add(1) <= 5 {
			return []error{sink.Overloaded(sink.RetryAfter(errors.New("http 503"), 0))}
		}
		return nil
	}}
	d := s.drainer(t, "r1/boot", map[string]PipeConfig{pipe: {Sink: snk, MaxAttempts: 2}}, nil)
	drainUntil(t, d, "row delivered", func() bool { return s.row(t, id).status == "delivered" })
	r := s.row(t, id)
	if got, want := r.attempts, 1; got != want || calls.Load() != 6 {
		t.Fatalf("row = %+v after %d calls; want delivered with %d attempt after 6 calls", r, calls.Load(), want)
	}
}

// A segment whose every record is refused for capacity waits whole, and
// its attempts are given back: after more overloads than MaxAttempts it is
// still delivered, nothing dead, no record moved to a row.
func TestOverloadedSegmentHeldWithoutAttempts(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	enqueueTxns(t, st, pipe, 2, 10)
	var overloads atomic.Int64
	log := newDeliveryLog()
	log.fail = func(Record, int) error {
		if overloads.Add(1) <= 10*4 {
			return sink.Overloaded(sink.RetryAfter(errors.New("http 429"), 0))
		}
		return nil
	}
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: log.sink(), MaxAttempts: 2}}, nil)
	drainUntil(t, d, "every record delivered", func() bool {
		for _, r := range records(t, st.db, st.schema) {
			if r.Status != "delivered" {
				return false
			}
		}
		return true
	})
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox}"); n != 0 {
		t.Fatalf("%d outbox rows, want the segments held whole while overloaded", n)
	}
	if n := st.count(t, "SELECT MAX(attempts) FROM "+state.Table(st.schema, "segments")); n != 1 {
		t.Fatalf("segments' max attempts = %d, want 1 (overloads not counted)", n)
	}
}

// pacedSink is a fake sink that paces itself and sends one request per
// record, like the webhook sink.
type pacedSink struct{ fakeSink }

func (pacedSink) Paced() bool               { return true }
func (pacedSink) OneRequestPerRecord() bool { return true }

// A call that stalls does not hold its segment or the pipe's later
// segments: the segment is recorded with the stalled record as a row
// claimed by us, the later records of its key queue behind it as rows,
// every other key goes on; when the call returns its outcome lands on the
// row and the key continues, in order.
func TestStalledCallDoesNotHoldLaterSegments(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	order := enqueueTxns(t, st, pipe, 3, 20)
	snk := newStallingSink(t) // the first record of key {"id":0} stalls
	// Calls of one record: the stalled call holds only its own.
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: pacedSink{snk.fake()}, BatchSize: 1, Concurrency: 32}}, nil)
	defer wait.Background(t, 30*time.Second, d.Run)()
	defer snk.free() // before the drainer stops, also when the test fails
	waitFor(t, "every segment done and every other key delivered while one call stalls", func() bool {
		snk.mu.Lock()
		defer snk.mu.Unlock()
		for k := range order {
			if k != `{"id":0}` && len(snk.got[k]) != 3 {
				return false
			}
		}
		return st.count(t, "SELECT COUNT(*) FROM "+state.Table(st.schema, "segments")+" WHERE status = 'pending'") == 0
	})
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status = 'pending'"); n != 3 {
		t.Fatalf("%d pending rows while the call stalls, want 3 (the stalled record, claimed, and its key's two later ones)", n)
	}
	snk.free()
	waitFor(t, "the stalled key delivered after its call returned", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status = 'delivered'") == 3
	})
	snk.mu.Lock()
	defer snk.mu.Unlock()
	for k := range order {
		if g := strings.Join(snk.got[k], " "); g != "0-1-1 0-1-2 0-1-3" {
			t.Errorf("key %s delivered %s, want 0-1-1 0-1-2 0-1-3 (once each, in order)", k, g)
		}
	}
	if n := st.count(t, "SELECT MAX(attempts) FROM {outbox}"); n != 1 {
		t.Errorf("rows' max attempts %d, want 1", n)
	}
}

// "delivery failed" lines carry the error and the sink, and an outage does
// not flood the log: one line per failLogEvery per pipe, saying how many
// failures it left out.
func TestFailureLogRateLimited(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	p := &pipeDrainer{name: "i:app.t:hook", log: zap.New(core)}
	for range 10 {
		p.logFailure("delivery failed, will retry", 2, "post http://h/x: http 500")
	}
	if got := logs.Len(); got != 1 {
		t.Fatalf("%d lines for 10 failures within %v, want 1", got, failLogEvery)
	}
	p.mu.Lock()
	p.failLogAt = p.failLogAt.Add(-failLogEvery)
	p.mu.Unlock()
	p.logFailure("delivery failed, will retry", 1, "post http://h/x: http 503")
	entries := logs.All()
	if len(entries) != 2 {
		t.Fatalf("%d lines, want 2", len(entries))
	}
	f := entries[1].ContextMap()
	if f["error"] != "post http://h/x: http 503" || f["sink"] != "hook" || f["not_logged_since_last"] != int64(18) {
		t.Fatalf("second line's fields = %v, want the error, the sink and 18 rows left out", f)
	}
}
