package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

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
