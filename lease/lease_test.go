package lease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/statetest"
	"github.com/cdcout/cdcout/state"
)

func TestMain(m *testing.M) { mysqltest.RunMain(m) }

func newManager(t *testing.T) (*Manager, *sql.DB, string) {
	t.Helper()
	db, schema := statetest.New(t, "lease")
	return NewManager(db, schema), db, schema
}

// checkNextTenure fails t unless next, taken after old's tenure ended
// (how: for the messages), is the next epoch and old no longer renews.
func checkNextTenure(t *testing.T, m *Manager, old, next Lease, how string) {
	t.Helper()
	if next.Epoch != old.Epoch+1 {
		t.Fatalf("%s: epoch %d, want %d", how, next.Epoch, old.Epoch+1)
	}
	if _, err := m.Renew(context.Background(), old); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("%s: old tenure renew: err = %v, want ErrNotHeld", how, err)
	}
}

func mustAcquire(t *testing.T, m *Manager, name, holder string, ttl time.Duration) Lease {
	t.Helper()
	l, ok, err := m.Acquire(context.Background(), name, holder, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("%s could not acquire %s (held by %q)", holder, name, l.Holder)
	}
	return l
}

// waitExpired polls the database clock until the lease has expired there.
func waitExpired(t *testing.T, m *Manager, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		l, _, err := m.Get(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if !l.Live {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("lease %s still live after 10s", name)
}

func TestExpiryByDatabaseClock(t *testing.T) {
	m, _, _ := newManager(t)
	ctx := context.Background()
	a := mustAcquire(t, m, "drain/p", "a/1", time.Second)
	if a.Epoch != 1 || a.Holder != "a/1" || !a.Live {
		t.Fatalf("first acquire: %+v", a)
	}
	if !a.Valid(time.Now()) {
		t.Fatal("fresh lease not valid locally")
	}
	if got := time.Until(a.LocalDeadline); got > time.Second-safetyMargin(time.Second)+10*time.Millisecond {
		t.Fatalf("local deadline %v away, want at most ttl - margin", got)
	}
	// While live, another holder cannot take it.
	if cur, ok, err := m.Acquire(ctx, "drain/p", "b/1", time.Second); err != nil || ok || cur.Holder != "a/1" {
		t.Fatalf("b took a live lease: ok=%v cur=%+v err=%v", ok, cur, err)
	}
	// The local deadline ends before the database expiry.
	if l, _, _ := m.Get(ctx, "drain/p"); !l.Live {
		t.Fatal("lease expired in the database before the holder's local deadline could")
	}
	waitExpired(t, m, "drain/p")
	if a.Valid(time.Now()) {
		t.Fatal("lease still valid locally after the database expired it")
	}
	b := mustAcquire(t, m, "drain/p", "b/1", time.Second)
	if got, want := b.Epoch, uint64(2); got != want {
		t.Fatalf("epoch after takeover = %d, want %d", got, want)
	}
}

func TestEpochGrowsOnTakeoverOnly(t *testing.T) {
	m, _, _ := newManager(t)
	ctx := context.Background()
	a := mustAcquire(t, m, "enqueue/i", "a/1", 10*time.Second)
	for i := 0; i < 3; i++ {
		again := mustAcquire(t, m, "enqueue/i", "a/1", 10*time.Second)
		if again.Epoch != a.Epoch {
			t.Fatalf("re-acquire by holder changed epoch %d -> %d", a.Epoch, again.Epoch)
		}
		r, err := m.Renew(ctx, again)
		if err != nil {
			t.Fatal(err)
		}
		if r.Epoch != a.Epoch {
			t.Fatalf("renew changed epoch %d -> %d", a.Epoch, r.Epoch)
		}
		if !r.ExpiresAt.After(a.ExpiresAt) && i == 2 {
			t.Fatalf("renew did not extend: %v then %v", a.ExpiresAt, r.ExpiresAt)
		}
	}
	if err := m.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, m, "enqueue/i", "b/1", 10*time.Second)
	if got, want := b.Epoch, a.Epoch+1; got != want {
		t.Fatalf("epoch after takeover = %d, want %d", got, want)
	}
	// A different lease name is independent.
	c := mustAcquire(t, m, "enqueue/j", "b/1", 10*time.Second)
	if c.Epoch != 1 {
		t.Fatalf("new lease epoch = %d, want 1", c.Epoch)
	}
}

func TestPausedHolderRenewFailsAfterTakeover(t *testing.T) {
	m, _, _ := newManager(t)
	ctx := context.Background()
	a := mustAcquire(t, m, "drain/x", "a/1", 300*time.Millisecond)
	// a is "paused": it does not renew until well past its TTL.
	waitExpired(t, m, "drain/x")
	b := mustAcquire(t, m, "drain/x", "b/1", 10*time.Second)
	if _, err := m.Renew(ctx, a); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("paused holder renew: err = %v, want ErrNotHeld", err)
	}
	if err := m.Release(ctx, a); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("paused holder release: err = %v, want ErrNotHeld", err)
	}
	// b is unaffected by a's attempts.
	if cur, _, _ := m.Get(ctx, "drain/x"); cur.Holder != "b/1" || cur.Epoch != b.Epoch || !cur.Live {
		t.Fatalf("after stale renew: %+v", cur)
	}
	if _, err := m.Renew(ctx, b); err != nil {
		t.Fatalf("holder renew: %v", err)
	}
	// Even with the same holder name, an expired lease re-acquired is a new
	// tenure: the old handle's epoch no longer renews.
	c := mustAcquire(t, m, "drain/y", "c/1", 300*time.Millisecond)
	waitExpired(t, m, "drain/y")
	c2 := mustAcquire(t, m, "drain/y", "c/1", 10*time.Second)
	checkNextTenure(t, m, c, c2, "re-acquire after lapse")
}

func TestReleaseLetsAnotherAcquireAtOnce(t *testing.T) {
	m, _, _ := newManager(t)
	ctx := context.Background()
	a := mustAcquire(t, m, "drain/r", "a/1", time.Hour)
	if err := m.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, m, "drain/r", "b/1", time.Hour)
	checkNextTenure(t, m, a, b, "release+takeover")
}

func TestConcurrentAcquireOneWinner(t *testing.T) {
	m, _, _ := newManager(t)
	for round := 0; round < 5; round++ {
		name := fmt.Sprintf("enqueue/race%d", round)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []Lease
		)
		for i := 0; i < 10; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, ok, err := m.Acquire(context.Background(), name, fmt.Sprintf("r%d/n", i), 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					winners = append(winners, l)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners: %+v", round, len(winners), winners)
		}
		cur, _, err := m.Get(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if cur.Holder != winners[0].Holder || cur.Epoch != 1 {
			t.Fatalf("round %d: row %+v, winner %+v", round, cur, winners[0])
		}
	}
}

func TestListByPrefix(t *testing.T) {
	m, _, _ := newManager(t)
	mustAcquire(t, m, "drain/a", "x/1", time.Minute)
	mustAcquire(t, m, "drain/b", "y/1", time.Minute)
	mustAcquire(t, m, "enqueue/a", "x/1", time.Minute)
	mustAcquire(t, m, "drain_other", "x/1", time.Minute)
	ls, err := m.List(context.Background(), "drain/")
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 || ls[0].Name != "drain/a" || ls[1].Name != "drain/b" || !ls[0].Live {
		t.Fatalf("List(drain/) = %+v", ls)
	}
	if _, found, err := m.Get(context.Background(), "nope"); err != nil || found {
		t.Fatalf("Get(missing): found=%v err=%v", found, err)
	}
}

func TestKeeperRenewsAndReportsLoss(t *testing.T) {
	m, db, schema := newManager(t)
	l := mustAcquire(t, m, "drain/k", "k/1", 600*time.Millisecond)
	k := m.NewKeeper(l, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	// Held across several TTLs thanks to renewals.
	deadline := time.Now().Add(3 * 600 * time.Millisecond)
	for time.Now().Before(deadline) {
		if !k.Lease().Valid(time.Now()) {
			t.Fatal("kept lease became invalid")
		}
		time.Sleep(30 * time.Millisecond)
	}
	// Simulate a takeover behind the keeper's back.
	if _, err := db.Exec("UPDATE "+state.Table(schema, "leases")+" SET holder='thief/1', epoch=epoch+1 WHERE name=?", "drain/k"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("keeper did not report loss")
	}
	if err := <-done; !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Run = %v, want ErrNotHeld", err)
	}
}
