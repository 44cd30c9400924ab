package engine

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/internal/statetest"
	"github.com/cdcout/cdcout/lease"
)

// TestDrainLeasesFairShareOnDatabase runs the drain lease manager of three
// replicas against the real leases table: one replica alone takes every
// pipe; replicas that join get their share as the others release extras;
// a replica that stops renewing (dead) has its pipes taken within about a
// TTL; a graceful stop releases at once.
func TestDrainLeasesFairShareOnDatabase(t *testing.T) {
	db, stateDB := statetest.New(t, "engine_drainlease")
	m := lease.NewManager(db, stateDB)
	const ttl = time.Second
	var pipes []string
	for i := range 5 {
		pipes = append(pipes, fmt.Sprintf("inst:db.t%d:hook", i))
	}
	mk := func(id string) *drainLeases {
		d := newDrainLeases(m, db, stateDB, "inst", id, id+"/boot", ttl, zap.NewNop())
		d.addPipes(pipes)
		return d
	}
	ctx := t.Context()
	counts := func(ds ...*drainLeases) ([]int, int) {
		var out []int
		total := 0
		for _, d := range ds {
			out = append(out, d.count())
			total += d.count()
		}
		return out, total
	}
	// settle ticks every replica in turn until the assignment is stable
	// and complete, or fails after timeout.
	settle := func(want func(c []int, total int) bool, ds ...*drainLeases) []int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			for _, d := range ds {
				d.tick(ctx)
			}
			c, total := counts(ds...)
			if want(c, total) {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("no fair assignment: %v (total %d)", c, total)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	a := mk("a")
	if c := settle(func(c []int, total int) bool { return total == 5 }, a); c[0] != 5 {
		t.Fatalf("a alone holds %d of 5 pipes", c[0])
	}
	b := mk("b")
	settle(func(c []int, total int) bool { return total == 5 && c[0] <= 3 && c[1] <= 3 && c[1] >= 2 }, a, b)
	c := mk("c")
	settle(func(n []int, total int) bool { return total == 5 && n[0] <= 2 && n[1] <= 2 && n[2] <= 2 && n[2] >= 1 }, a, b, c)

	// c dies: it stops renewing. Its pipes go to a and b once its leases
	// (and its member lease) expire.
	died := time.Now()
	settle(func(n []int, total int) bool { return n[0]+n[1] == 5 && n[0] <= 3 && n[1] <= 3 }, a, b)
	if took := time.Since(died); took > 3*ttl {
		t.Errorf("a dead replica's pipes were taken after %s, want within about a TTL (%s)", took, ttl)
	}

	// b stops gracefully: a takes everything without waiting for a TTL.
	b.releaseAll(ctx)
	stopped := time.Now()
	settle(func(n []int, total int) bool { return n[0] == 5 }, a)
	if took := time.Since(stopped); took > ttl {
		t.Errorf("a gracefully stopped replica's pipes were taken after %s, want less than a TTL (%s)", took, ttl)
	}
}
