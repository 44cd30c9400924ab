package outbox

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

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

// A segment outcome whose COMMIT reached the database but whose answer was
// lost (the link dropped) is found written, not taken for a claim that
// lapsed: the stalled call's outcome then lands on its row when it
// returns, and its key goes on at once. Taken for a lapse, the outcome was
// dropped and the stalled record's row stayed claimed by us for the claim
// lease (5 minutes here), its key's later records behind it.
//
// "retried": the write's next try finds the segment done under our claim.
// "given up": the write has no retries left (retryFor 0), so the segment
// pass gives up on it; once the call returns, the segment's status says
// the outcome was written after all.
func TestSegmentOutcomeWithLostAnswer(t *testing.T) {
	for _, c := range []struct {
		name     string
		retryFor time.Duration
	}{{"retried", 5 * time.Second}, {"given up", 0}} {
		t.Run(c.name, func(t *testing.T) { segmentOutcomeWithLostAnswer(t, c.retryFor) })
	}
}

func segmentOutcomeWithLostAnswer(t *testing.T, retryFor time.Duration) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	order := enqueueTxns(t, st, pipe, 3, 20)
	db, proxy := proxiedDB(t)
	r := &faultRig{st: st, pipe: pipe, order: order, db: db, proxy: proxy}
	snk := newStallingSink(t) // the first record of key {"id":0} stalls
	stalling := snk.fake()
	var once sync.Once
	lose := fakeSink{fn: func(ctx context.Context, recs []Record) []error {
		for _, rec := range recs {
			if rec.Key == `{"id":0}` && gtidOf(t, rec) == "0-1-1" {
				// From the stalled call on, every COMMIT's answer is lost:
				// the first segment's outcome (done, the stalled record's
				// row) commits unanswered, and so do the later segments'.
				once.Do(func() { proxy.LoseAnswersTo("COMMIT") })
			}
		}
		return stalling.fn(ctx, recs)
	}}
	core, logs := observer.New(zap.InfoLevel)
	d := r.st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: pacedSink{lose}, BatchSize: 1, Concurrency: 32}}, func(c *DrainerConfig) {
		c.DB, c.ClaimLease = db, 5*time.Minute
		c.Logger = zap.New(zapcore.NewTee(core, zaptest.NewLogger(t).Core()))
	})
	d.retryFor, d.stmtTimeout = retryFor, time.Second
	defer wait.Background(t, 30*time.Second, d.Run)()
	defer snk.free() // before the drainer stops, also when the test fails
	waitFor(t, "every segment done while key 0's first call stalls", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM {segments} WHERE status <> 'done'") == 0
	})
	if n := proxy.Lost(); n == 0 {
		t.Fatal("no COMMIT's answer was lost: the test did not make an outcome commit unanswered")
	}
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status = 'pending'"); n != 3 {
		t.Fatalf("%d pending rows while the call stalls, want 3 (the stalled record, claimed, and its key's two later ones)", n)
	}
	proxy.Heal()
	snk.free()
	freed := time.Now()
	waitFor(t, "key 0's three records delivered once its call returned", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status = 'delivered'") == 3
	})
	took := time.Since(freed)
	t.Logf("%d answers lost; call returned to its key's records delivered: %v", proxy.Lost(), took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Fatalf("key 0 went on %v after its call returned, want within seconds (not the claim lease)", took)
	}
	afterAll := logs.FilterMessageSnippet("written after all").Len()
	if retryFor == 0 && afterAll != 1 {
		t.Fatalf("%d \"written after all\" lines, want 1: the test did not make the segment pass give up on the outcome", afterAll)
	}
	if n := logs.FilterMessageSnippet("another drainer has it").Len(); n != 0 {
		t.Fatalf("%d segments taken for lapsed claims; every outcome was ours and written", n)
	}
	snk.mu.Lock()
	defer snk.mu.Unlock()
	for k := range order {
		if g := strings.Join(snk.got[k], " "); g != "0-1-1 0-1-2 0-1-3" {
			t.Errorf("key %s delivered %s, want 0-1-1 0-1-2 0-1-3 (once each, in order)", k, g)
		}
	}
}
