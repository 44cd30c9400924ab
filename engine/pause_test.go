package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/control"
)

// TestPausedSinkHoldsAcrossFleet runs two replicas feeding two webhooks.
// With sink a paused, b gets every change while a gets none — also after
// the replica that may have held a's drain lease stops and the other
// takes the pipes over — and a's records stay in the outbox. Resumed, a
// gets every change exactly once, each key's in commit order.
func TestPausedSinkHoldsAcrossFleet(t *testing.T) {
	rcvA, rcvB := newReceiver(t), newReceiver(t)
	s := newSource(t, "pause", "id INT PRIMARY KEY, v INT", func(cfg *config.Config) {
		cfg.LeaseTTL = 2 * time.Second
		cfg.Sinks = []config.Sink{{Name: "a", URL: rcvA.srv.URL}, {Name: "b", URL: rcvB.srv.URL}}
	})
	exec := func(q string) {
		t.Helper()
		if _, err := s.db.Exec(strings.ReplaceAll(q, "{t}", "`"+s.src+"`.t")); err != nil {
			t.Fatal(err)
		}
	}
	cfg2 := *s.cfg
	cfg2.ReplicaID = "r2"
	var logs []*observer.ObservedLogs
	var stops []func()
	for _, cfg := range []*config.Config{s.cfg, &cfg2} {
		core, l := observer.New(zap.InfoLevel)
		logs = append(logs, l)
		stops = append(stops, runEngine(t, cfg, zap.New(core)))
	}
	for id := range 10 {
		exec(fmt.Sprintf("INSERT INTO {t} VALUES (%d, %d)", id, id))
	}
	waitFor(t, "both sinks deliver", 30*time.Second, func() bool { return rcvA.count() == 10 && rcvB.count() == 10 })

	ctx := context.Background()
	pausedAt := time.Now()
	if changed, err := control.SetPaused(ctx, s.db, s.stateDB, "pause", "a", true, "test"); err != nil || !changed {
		t.Fatalf("pause: changed %v, %v", changed, err)
	}
	waitFor(t, "every replica sees the pause", 10*time.Second, func() bool {
		return logs[0].FilterMessage("sink paused: its pipes are not delivered until it is resumed").Len() > 0 &&
			logs[1].FilterMessage("sink paused: its pipes are not delivered until it is resumed").Len() > 0
	})
	t.Logf("both replicas saw the pause %s after it was written", time.Since(pausedAt).Round(time.Millisecond))
	for id := 10; id < 30; id++ {
		exec(fmt.Sprintf("INSERT INTO {t} VALUES (%d, %d)", id, id))
	}
	exec("UPDATE {t} SET v = v + 100")
	exec("UPDATE {t} SET v = v + 100")
	waitFor(t, "b gets the changes made during the pause", 30*time.Second, func() bool { return rcvB.count() == 90 })

	// The first replica stops; the second takes its drain leases and
	// must hold a too.
	stops[0]()
	waitFor(t, "r2 holds both drain leases", 30*time.Second, func() bool {
		var n int
		err := s.db.QueryRow("SELECT COUNT(*) FROM `" + s.stateDB + "`.leases WHERE name LIKE 'drain/pause:%' AND holder LIKE 'r2/%' AND expires_at > NOW(6)").Scan(&n)
		return err == nil && n == 2
	})
	exec("INSERT INTO {t} VALUES (30, 30)")
	waitFor(t, "b gets the change made after the takeover", 30*time.Second, func() bool { return rcvB.count() == 91 })
	if got := rcvA.count(); got != 10 {
		t.Fatalf("paused sink a got %d records, want the 10 from before the pause", got)
	}
	var pending int
	if err := s.db.QueryRow("SELECT COALESCE(SUM(records), 0) FROM `" + s.stateDB + "`.segments WHERE pipe LIKE 'pause:%:a' AND status = 'pending'").Scan(&pending); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := s.db.QueryRow("SELECT COUNT(*) FROM `" + s.stateDB + "`.outbox WHERE pipe LIKE 'pause:%:a' AND status = 'pending'").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if pending+rows != 81 {
		t.Errorf("a's undelivered records in the outbox: %d in segments + %d rows, want 81", pending, rows)
	}

	resumedAt := time.Now()
	if changed, err := control.SetPaused(ctx, s.db, s.stateDB, "pause", "a", false, "test"); err != nil || !changed {
		t.Fatalf("resume: changed %v, %v", changed, err)
	}
	waitFor(t, "a's first delivery after the resume", 30*time.Second, func() bool { return rcvA.count() > 10 })
	t.Logf("first delivery to a %s after the resume", time.Since(resumedAt).Round(time.Millisecond))
	waitFor(t, "a gets everything after the resume", 30*time.Second, func() bool { return rcvA.count() == 91 })
	rcvA.mu.Lock()
	defer rcvA.mu.Unlock()
	if rcvA.dups != 0 {
		t.Errorf("a got %d redeliveries, want none", rcvA.dups)
	}
	last := map[string]float64{}
	for _, d := range rcvA.order {
		if v, ok := last[d.key]; ok && d.v <= v {
			t.Errorf("key %s: v %v arrived after %v", d.key, d.v, v)
		}
		last[d.key] = d.v
	}
	if len(last) != 31 {
		t.Errorf("a got %d keys, want 31", len(last))
	}
}
