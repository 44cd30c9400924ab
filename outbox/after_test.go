package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/state"
)

// predecessor is a Batch.After wait the test answers: the lastID or
// error the batch before reports once it is over.
type predecessor struct {
	asked  chan struct{} // a value per call
	answer chan predAnswer
}

type predAnswer struct {
	lastID string
	err    error
}

func newPredecessor() *predecessor {
	return &predecessor{asked: make(chan struct{}, 16), answer: make(chan predAnswer, 1)}
}

func (p *predecessor) wait(ctx context.Context) (string, error) {
	p.asked <- struct{}{}
	select {
	case a := <-p.answer:
		p.answer <- a // every later call gets the same answer
		return a.lastID, a.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func afterBatch(t *testing.T, s *Store, txn int) (*Batch, []Pending, *Checkpoint) {
	t.Helper()
	var items []Pending
	for i := 0; i < 20; i++ {
		items = append(items, gtidItem("a:app.users:hook", txn, i))
	}
	cp := &Checkpoint{Source: "enqueue/a", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: fmt.Sprint("0-1-", txn)}}
	b, err := s.PrepareBatch(items, cp)
	if err != nil {
		t.Fatal(err)
	}
	return b, items, cp
}

// A batch that follows another (Batch.After) writes while the other
// runs but commits only after it committed; its ids then come after the
// other's, and it never commits when the other did not.
func TestEnqueueBatchAfter(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	fence := grantLease(t, db, schema, "enqueue/a", "r1", 1, time.Hour)
	claims := func(txn int) int {
		return count(t, db, "SELECT COUNT(*) FROM "+state.Table(schema, "claims")+" WHERE change_key LIKE ?", fmt.Sprintf("g:0-1-%d:%%", txn))
	}
	checkpoint := func() string {
		pos, err := s.LoadCheckpoint(ctx, "enqueue/a")
		if err != nil || pos == nil {
			return fmt.Sprint("none ", err)
		}
		return pos.GTIDSet
	}

	// The second batch (1) is prepared after the first (0) but waits for
	// it with its rows written and uncommitted.
	first, _, firstCP := afterBatch(t, s, 0)
	second, _, _ := afterBatch(t, s, 1)
	p := newPredecessor()
	second.After(p.wait)
	done := make(chan error, 1)
	var res EnqueueResult
	go func() {
		var err error
		res, err = s.EnqueueBatch(ctx, "r1", fence, second)
		done <- err
	}()
	<-p.asked
	if n := claims(1); n != 0 {
		t.Fatalf("%d claims of the second batch visible before the first committed", n)
	}
	r0, err := s.EnqueueBatch(ctx, "r1", fence, first)
	if err != nil || r0.LastID == "" {
		t.Fatalf("first batch: %+v, %v", r0, err)
	}
	if got := checkpoint(); got != firstCP.Pos.GTIDSet {
		t.Fatalf("checkpoint %s after the first batch, want %s", got, firstCP.Pos.GTIDSet)
	}
	p.answer <- predAnswer{lastID: r0.LastID}
	if err := <-done; err != nil {
		t.Fatalf("second batch: %v", err)
	}
	if res.Records != 20 || res.LastID <= r0.LastID || checkpoint() != "0-1-1" || claims(1) != 20 {
		t.Fatalf("second batch: %+v (first's last id %s), checkpoint %s, %d claims", res, r0.LastID, checkpoint(), claims(1))
	}

	// The batch before was retried with ids drawn after this one's: this
	// one is retried with new ids, greater than the other's.
	third, _, _ := afterBatch(t, s, 2)
	p = newPredecessor()
	third.After(p.wait)
	later := NewID() // drawn after the third's ids, as a retry's would be
	p.answer <- predAnswer{lastID: later}
	r2, err := s.EnqueueBatch(ctx, "r1", fence, third)
	if err != nil {
		t.Fatalf("third batch: %v", err)
	}
	var minID string
	if err := db.QueryRow("SELECT MIN(id) FROM "+state.Table(schema, "segments")+" WHERE records = 20 AND id > ?", res.LastID).Scan(&minID); err != nil {
		t.Fatal(err)
	}
	if minID <= later || r2.LastID <= later || checkpoint() != "0-1-2" {
		t.Fatalf("third batch's segment starts at %s, last id %s; want both after %s (checkpoint %s)", minID, r2.LastID, later, checkpoint())
	}

	// The batch before did not commit: neither does this one.
	fourth, _, _ := afterBatch(t, s, 3)
	p = newPredecessor()
	fourth.After(p.wait)
	p.answer <- predAnswer{err: fmt.Errorf("%w: lease lost", ErrPredecessor)}
	if _, err := s.EnqueueBatch(ctx, "r1", fence, fourth); !errors.Is(err, ErrPredecessor) {
		t.Fatalf("after a failed batch: err %v, want ErrPredecessor", err)
	}
	if n := claims(3); n != 0 || checkpoint() != "0-1-2" {
		t.Fatalf("after a failed batch: %d claims, checkpoint %s; want none and 0-1-2", n, checkpoint())
	}

	// The batch before is slow: this one lets its locks go and waits for
	// it outside its transaction, then commits.
	// It logs the state database's busy sessions, its own open
	// transaction among them.
	old := predecessorWait
	predecessorWait = 100 * time.Millisecond
	t.Cleanup(func() { predecessorWait = old })
	core, logs := observer.New(zap.InfoLevel)
	s.logger = zap.New(core)
	lastWaitsLog.Store(0)
	fifth, _, _ := afterBatch(t, s, 4)
	p = newPredecessor()
	fifth.After(p.wait)
	go func() {
		var err error
		_, err = s.EnqueueBatch(ctx, "r1", fence, fifth)
		done <- err
	}()
	<-p.asked // in the transaction
	<-p.asked // outside it, after the rollback
	if n := claims(4); n != 0 {
		t.Fatalf("%d claims of a batch waiting for a slow one", n)
	}
	p.answer <- predAnswer{lastID: r2.LastID}
	if err := <-done; err != nil || claims(4) != 20 || checkpoint() != "0-1-4" {
		t.Fatalf("after the slow one committed: %v, %d claims, checkpoint %s", err, claims(4), checkpoint())
	}
	waits := logs.FilterMessageSnippet("waited over its limit").All()
	if len(waits) != 1 {
		t.Fatalf("%d logs of the busy sessions, want 1", len(waits))
	}
	sessions := fmt.Sprint(waits[0].ContextMap()["sessions"])
	t.Logf("busy sessions: %s", sessions)
	if !strings.Contains(sessions, "Sleep") || !strings.Contains(sessions, "trx=RUNNING") {
		t.Fatalf("busy sessions %s: want the waiting enqueue transaction's, idle in a RUNNING transaction", sessions)
	}
}

func TestStatementHeadLeavesValuesOut(t *testing.T) {
	for q, want := range map[string]string{
		"INSERT IGNORE INTO `s`.`claims` (pipe, change_key) VALUES ('p', 'k')": "INSERT IGNORE INTO `s`.`claims`",
		"CHANGE MASTER TO MASTER_PASSWORD='hunter2', MASTER_HOST='h'":          "CHANGE MASTER TO MASTER_PASSWORD",
		"ALTER USER u IDENTIFIED BY 'hunter2'":                                 "ALTER USER u IDENTIFIED",
		"SET PASSWORD=PASSWORD('hunter2')":                                     "SET PASSWORD",
		"SELECT\n1":                                                            "SELECT 1",
		"":                                                                     "",
	} {
		if got := statementHead(q); got != want || strings.Contains(got, "hunter2") {
			t.Errorf("statementHead(%q) = %q, want %q", q, got, want)
		}
	}
}
