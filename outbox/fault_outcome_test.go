package outbox

import (
	"context"
	"fmt"
	"sync"
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
	for _, fault := range faults {
		t.Run(fault, func(t *testing.T) { testUnwrittenRowOutcome(t, fault) })
	}
}

func testUnwrittenRowOutcome(t *testing.T, fault string) {
	st := newTestState(t)
	const pipe = "i:app.t:fake"
	order := st.insertKeyed(t, pipe, 12, 3)
	db, proxy := proxiedDB(t)
	var (
		mu     sync.Mutex
		got    = map[string][]string{}
		sent   = map[string]int{}
		broken bool
	)
	snk := fakeSink{fn: func(_ context.Context, recs []Record) []error {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range recs {
			got[r.Key] = append(got[r.Key], r.ID)
			sent[r.ID]++
		}
		if !broken {
			// Delivered: now the outcome is to be written.
			broken = true
			breakLink(proxy, fault)
		}
		return make([]error, len(recs))
	}}
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: snk, BatchSize: 4, Concurrency: 1}}, func(c *DrainerConfig) {
		c.DB = db
		c.ClaimLease = 5 * time.Minute
	})
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
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status = 'delivered'"); n != 0 {
		t.Fatalf("%d rows marked delivered while the state link was broken; the test did not make the outcome write fail", n)
	}
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE claimer = ? AND next_attempt_at > NOW(6)", d.claimer); n < first {
		t.Fatalf("%d rows claimed by us, want at least the %d of the kept outcome", n, first)
	}
	proxy.Heal()
	healed := time.Now()
	waitFor(t, "every row delivered", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE status <> 'delivered'") == 0
	})
	took := time.Since(healed)
	t.Logf("%s: %d rows' outcome kept; heal to every row delivered: %v", fault, first, took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Fatalf("delivery resumed %v after the heal, want within seconds (not the claim lease)", took)
	}
	if n := kept(); n != 0 {
		t.Fatalf("%d rows' outcomes still kept after every row is delivered", n)
	}
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox} WHERE attempts <> 1"); n != 0 {
		t.Fatalf("%d rows delivered with attempts <> 1: a kept outcome's rows were claimed again, or a taken-back claim kept its attempt", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range sent {
		if n != 1 {
			t.Fatalf("row %s sent %d times, want once: its outcome was known and kept", id, n)
		}
	}
	checkKeyOrder(t, got, order)
}

// The same for a segment: the state link breaks as the segment's records
// are delivered, so its outcome (done, and the rows that leave it) cannot
// be written past its retries. The next segment pass writes the kept
// outcome once the link is back, instead of the segment waiting out the
// claim lease with every later segment of the pipe behind it, and instead
// of delivering it again: each record goes out once, in key order.
func TestUnwrittenSegmentOutcomeIsWrittenNextPass(t *testing.T) {
	for _, fault := range faults {
		t.Run(fault, func(t *testing.T) { testUnwrittenSegmentOutcome(t, fault) })
	}
}

func testUnwrittenSegmentOutcome(t *testing.T, fault string) {
	st := newTestState(t)
	const pipe = "a:app.users:seg"
	order := enqueueTxns(t, st, pipe, 3, 4)
	db, proxy := proxiedDB(t)
	log := newDeliveryLog()
	broken := false
	log.fail = func(Record, int) error {
		if !broken {
			broken = true
			breakLink(proxy, fault)
		}
		return nil
	}
	d := st.drainer(t, "d1", map[string]PipeConfig{pipe: {Sink: log.sink()}}, func(c *DrainerConfig) {
		c.DB = db
		c.ClaimLease = 5 * time.Minute
	})
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
	if n := st.count(t, "SELECT COUNT(*) FROM {segments} WHERE status = 'done'"); n != 0 {
		t.Fatalf("%d segments done while the state link was broken; the test did not make the outcome write fail", n)
	}
	proxy.Heal()
	healed := time.Now()
	waitFor(t, "every segment done", func() bool {
		return st.count(t, "SELECT COUNT(*) FROM {segments} WHERE status <> 'done'") == 0
	})
	took := time.Since(healed)
	t.Logf("%s: heal to every segment done: %v", fault, took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Fatalf("delivery resumed %v after the heal, want within seconds (not the claim lease)", took)
	}
	if n := st.count(t, "SELECT COUNT(*) FROM {outbox}"); n != 0 {
		t.Fatalf("%d records left their segments as rows; every one was delivered", n)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	idOf := map[string]string{}
	for _, r := range records(t, st.db, st.schema) {
		idOf[r.ChangeKey] = r.ID
	}
	for key, cks := range order {
		var want []string
		for _, ck := range cks {
			want = append(want, idOf[ck])
		}
		if got := log.byKey[key]; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("key %s delivered %v, want %v (commit order, once each)", key, got, want)
		}
	}
}
