package outbox

import (
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/wait"
)

// Issue 14, defect 1, for outcomes: the state link breaks exactly when a
// delivered batch's outcome is to be written (the sink breaks it as it
// returns). Past the outcome's retries the live drainer keeps the outcome
// and writes it on the next claim pass once the link is back, instead of
// leaving the delivered rows claimed for the claim lease (5 minutes here)
// with their keys' later rows behind them. Blackholed, every try of the
// write is cut off by its statement deadline. The outcome is known, so
// nothing is delivered twice; per-key order holds.
func TestUnwrittenRowOutcomeIsWrittenNextPass(t *testing.T) {
	forEachFault(t, func(t *testing.T, fault string) {
		r := newRowFaultRig(t)
		snk := newKeyedSink()
		broken := false
		snk.delivered = func() {
			if !broken {
				// Delivered: now the outcome is to be written.
				broken = true
				breakLink(r.proxy, fault)
			}
		}
		d := r.drainer(t, PipeConfig{Sink: snk.sink(), BatchSize: 4, Concurrency: 1})
		d.retryFor, d.stmtTimeout = time.Second, time.Second
		p := d.pipes[0]
		stop := wait.Background(t, 10*time.Second, d.Run)
		defer stop()
		kept := func() int {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.keptIDs)
		}
		// retryFor (1 s), then one more try of at most its deadline (1 s).
		wait.Until(t, "the delivered batch's outcome kept", 10*time.Second, func() bool { return kept() > 0 })
		first := kept()
		if n := r.st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status = 'delivered'"); n != 0 {
			t.Fatalf("%d rows marked delivered while the state link was broken; the test did not make the outcome write fail", n)
		}
		if n := r.st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE claimer = ? AND next_attempt_at > NOW(6)", d.claimer); n < first {
			t.Fatalf("%d rows claimed by us, want at least the %d of the kept outcome", n, first)
		}
		r.proxy.Heal()
		healed := time.Now()
		waitFor(t, "every row delivered", func() bool {
			return r.st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status <> 'delivered'") == 0
		})
		took := time.Since(healed)
		t.Logf("%s: %d rows' outcome kept; heal to every row delivered: %v", fault, first, took.Round(time.Millisecond))
		if took > 5*time.Second {
			t.Fatalf("delivery resumed %v after the heal, want within seconds (not the claim lease)", took)
		}
		if n := kept(); n != 0 {
			t.Fatalf("%d rows' outcomes still kept after every row is delivered", n)
		}
		if n := r.st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE attempts <> 1"); n != 0 {
			t.Fatalf("%d rows delivered with attempts <> 1: a kept outcome's rows were claimed again, or a taken-back claim kept its attempt", n)
		}
		snk.mu.Lock()
		defer snk.mu.Unlock()
		for id, n := range snk.sent {
			if n != 1 {
				t.Fatalf("row %s sent %d times, want once: its outcome was known and kept", id, n)
			}
		}
		checkKeyOrder(t, snk.got, r.order)
	})
}

// The same for a segment: the state link breaks as the segment's records
// are delivered, so its outcome (done, and the rows that leave it) cannot
// be written past its retries. The next segment pass writes the kept
// outcome once the link is back, instead of the segment waiting out the
// claim lease with every later segment of the pipe behind it, and instead
// of delivering it again: each record goes out once, in key order.
func TestUnwrittenSegmentOutcomeIsWrittenNextPass(t *testing.T) {
	forEachFault(t, func(t *testing.T, fault string) {
		r := newSegmentFaultRig(t)
		log := newDeliveryLog()
		broken := false
		log.fail = func(Record, int) error {
			if !broken {
				broken = true
				breakLink(r.proxy, fault)
			}
			return nil
		}
		d := r.drainer(t, PipeConfig{Sink: log.sink()})
		d.retryFor, d.stmtTimeout = time.Second, time.Second
		p := d.pipes[0]
		stop := wait.Background(t, 10*time.Second, d.Run)
		defer stop()
		stuck := func() *stuckClaim {
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.stuck
		}
		wait.Until(t, "the delivered segment's outcome kept", 10*time.Second, func() bool { return stuck() != nil })
		if c := stuck(); c.outcome == nil {
			t.Fatalf("stuck claim %+v has no kept outcome; a delivered segment's outcome is known", c)
		}
		if n := r.st.count(t, "SELECT COUNT(*) FROM {segments} WHERE status = 'done'"); n != 0 {
			t.Fatalf("%d segments done while the state link was broken; the test did not make the outcome write fail", n)
		}
		r.proxy.Heal()
		healed := time.Now()
		waitFor(t, "every segment done", func() bool {
			return r.st.count(t, "SELECT COUNT(*) FROM {segments} WHERE status <> 'done'") == 0
		})
		took := time.Since(healed)
		t.Logf("%s: heal to every segment done: %v", fault, took.Round(time.Millisecond))
		if took > 5*time.Second {
			t.Fatalf("delivery resumed %v after the heal, want within seconds (not the claim lease)", took)
		}
		if n := r.st.count(t, "SELECT COUNT(*) FROM {outbox}"); n != 0 {
			t.Fatalf("%d records left their segments as rows; every one was delivered", n)
		}
		log.mu.Lock()
		defer log.mu.Unlock()
		r.checkSegmentKeyOrder(t, log.byKey)
	})
}
