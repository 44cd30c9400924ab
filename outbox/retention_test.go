package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/wait"
	"github.com/cdcout/cdcout/state"
)

func TestJanitorDeletesOnlyOldDoneRowsAndClaims(t *testing.T) {
	s := newTestState(t)
	const pipe = "i:app.t:fake"
	old := func(id, status string) {
		s.exec(t, `UPDATE {outbox} SET status = ?, created_at = NOW(6) - INTERVAL 200 HOUR, next_attempt_at = NOW(6) - INTERVAL 100 HOUR WHERE id = ?`, status, id)
	}
	var oldDone, kept []string
	for i := 0; i < 5; i++ {
		id := s.insert(t, pipe, fmt.Sprintf("[%d]", i))
		old(id, "delivered")
		oldDone = append(oldDone, id)
	}
	deadOld := s.insert(t, pipe, `["dead"]`)
	old(deadOld, "dead")
	oldDone = append(oldDone, deadOld)
	for _, claimer := range []int{0, 42} { // pending, and pending claimed ("delivering")
		id := s.insert(t, pipe, fmt.Sprintf("[%d]", claimer))
		old(id, "pending")
		s.exec(t, `UPDATE {outbox} SET claimer = ? WHERE id = ?`, claimer, id)
		kept = append(kept, id)
	}
	// Created long ago but delivered recently: retention counts from the
	// delivery.
	lateDelivered := s.insert(t, pipe, `["late"]`)
	s.exec(t, `UPDATE {outbox} SET status = 'delivered', created_at = NOW(6) - INTERVAL 200 HOUR WHERE id = ?`, lateDelivered)
	kept = append(kept, lateDelivered)
	// Another pipe's old rows go too.
	otherOld := s.insert(t, "i:app.u:fake", `["other"]`)
	old(otherOld, "delivered")
	oldDone = append(oldDone, otherOld)
	recent := s.insert(t, pipe, `["recent"]`)
	s.exec(t, `UPDATE {outbox} SET status = 'delivered' WHERE id = ?`, recent)
	kept = append(kept, recent)
	attempts := state.Table(s.schema, "attempts")
	for _, id := range append(append([]string{}, oldDone...), kept...) {
		for n := 1; n <= 2; n++ {
			if _, err := s.db.Exec(`INSERT INTO `+attempts+` (outbox_id, n, at, duration_us) VALUES (?, ?, NOW(6), 1)`, id, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	claims := state.Table(s.schema, "claims")
	for i, age := range []string{"2 HOUR", "2 HOUR", "2 HOUR", "1 SECOND"} {
		if _, err := s.db.Exec(`INSERT INTO `+claims+` (pipe, change_key, digest, claimed_by, created_at)
VALUES (?, ?, REPEAT('a', 64), 'r/1', NOW(6) - INTERVAL `+age+`)`, pipe, fmt.Sprintf("g:x:%d", i)); err != nil {
			t.Fatal(err)
		}
	}

	leases := state.Table(s.schema, "leases")
	for _, l := range []struct{ name, expires string }{
		{"member/gone/n1/i", "NOW(6) - INTERVAL 2 HOUR"},      // deleted
		{"member/gone/n4/i", "NOW(6) - INTERVAL 3 HOUR"},      // deleted, in a second batch of 2
		{"member/gone/n5/i", "NOW(6) - INTERVAL 4 HOUR"},      // deleted
		{"member/recent/n2/i", "NOW(6) - INTERVAL 10 MINUTE"}, // kept: gone less than an hour
		{"member/live/n3/i", "NOW(6) + INTERVAL 10 SECOND"},   // kept
		{"drain/i:app.t:fake", "NOW(6) - INTERVAL 2 HOUR"},    // kept: not a member lease
	} {
		if _, err := s.db.Exec(`INSERT INTO `+leases+` (name, holder, epoch, expires_at) VALUES (?, 'h', 1, `+l.expires+`)`, l.name); err != nil {
			t.Fatal(err)
		}
	}

	j, err := NewJanitor(JanitorConfig{DB: s.db, Schema: s.schema, Retention: 72 * time.Hour, DedupWindow: time.Hour, BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	sw, err := j.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sw.Rows != int64(len(oldDone)) || sw.Attempts != int64(2*len(oldDone)) || sw.Claims != 3 || sw.Members != 3 {
		t.Fatalf("swept %+v, want %d rows, %d attempts, 3 claims, 3 member leases", sw, len(oldDone), 2*len(oldDone))
	}
	if n := s.count(t, `SELECT COUNT(*) FROM `+leases+` WHERE name LIKE 'member/gone/%'`); n != 0 {
		t.Fatalf("%d member leases expired hours ago are still there", n)
	}
	if n := s.count(t, `SELECT COUNT(*) FROM `+leases); n != 3 {
		t.Fatalf("%d leases left, want 3", n)
	}
	for _, id := range kept {
		if n := s.count(t, `SELECT COUNT(*) FROM {outbox} WHERE id = ?`, id); n != 1 {
			t.Fatalf("row %s deleted; pending, claimed and recently done rows must stay", id)
		}
		if n := s.count(t, `SELECT COUNT(*) FROM {attempts} WHERE outbox_id = ?`, id); n != 2 {
			t.Fatalf("attempts of kept row %s: %d", id, n)
		}
	}
	if n := s.count(t, `SELECT COUNT(*) FROM {outbox}`); n != len(kept) {
		t.Fatalf("%d rows left, want %d", n, len(kept))
	}
	if n := s.count(t, `SELECT COUNT(*) FROM {claims}`); n != 1 {
		t.Fatalf("%d claims left, want the recent one", n)
	}
	// Run sweeps, a fraction of Every after its start, and stops with its
	// context.
	recentDead := s.insert(t, pipe, `["x"]`)
	old(recentDead, "dead")
	j, err = NewJanitor(JanitorConfig{DB: s.db, Schema: s.schema, Retention: 72 * time.Hour, DedupWindow: time.Hour, BatchSize: 2,
		Every: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop := wait.Background(t, 30*time.Second, j.Run)
	waitFor(t, "Run sweeps", func() bool {
		return s.count(t, `SELECT COUNT(*) FROM {outbox} WHERE id = ?`, recentDead) == 0
	})
	stop()
	if n := s.count(t, `SELECT COUNT(*) FROM {outbox}`); n != len(kept) {
		t.Fatalf("%d rows left after Run, want %d", n, len(kept))
	}
}

// TestJanitorClaimSweepTakesNoGapLocks: a claims sweep while an enqueue
// transaction holds a fresh, uncommitted claim neither waits for that
// transaction nor stops another from inserting a claim in front of it.
// A range DELETE in REPEATABLE READ did both: it waited on the fresh
// claim holding a gap lock in front of it, and the other transaction's
// insert waited on that gap; with enqueues committing in record-id
// order, that was a cycle only a lock wait timeout broke.
func TestJanitorClaimSweepTakesNoGapLocks(t *testing.T) {
	s := newTestState(t)
	ctx := context.Background()
	const pipe = "i:app.t:fake"
	for i := range 3 {
		s.exec(t, `INSERT INTO `+state.Table(s.schema, "claims")+` (pipe, change_key, digest, claimed_by, created_at)
VALUES (?, ?, REPEAT('a', 64), 'r/1', NOW(6) - INTERVAL 2 HOUR)`, pipe, fmt.Sprintf("g:old:%d", i))
	}
	begin := func() *sql.Tx {
		c, err := s.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.ExecContext(ctx, `SET SESSION innodb_lock_wait_timeout = 2`); err != nil {
			t.Fatal(err)
		}
		tx, err := c.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback() })
		return tx
	}
	claim := func(tx *sql.Tx, key, age string) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO `+state.Table(s.schema, "claims")+` (pipe, change_key, digest, claimed_by, created_at)
VALUES (?, ?, REPEAT('b', 64), 'r/1', NOW(6) - INTERVAL `+age+`)`, pipe, key)
		return err
	}
	later := begin()
	if err := claim(later, "g:later", "0 SECOND"); err != nil {
		t.Fatal(err)
	}
	j, err := NewJanitor(JanitorConfig{DB: s.db, Schema: s.schema, DedupWindow: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sw, err := j.Sweep(sctx)
	if err != nil {
		t.Fatalf("sweep with an enqueue transaction open: %v", err)
	}
	if sw.Claims != 3 {
		t.Fatalf("swept %d claims, want the 3 old ones", sw.Claims)
	}
	// An earlier transaction's claim, in front of the open one in the
	// created_at index, goes in at once.
	earlier := begin()
	if err := claim(earlier, "g:earlier", "1 SECOND"); err != nil {
		t.Fatalf("claim in front of an open one after a sweep: %v", err)
	}
	if err := earlier.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := later.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := s.count(t, `SELECT COUNT(*) FROM {claims}`); n != 2 {
		t.Fatalf("%d claims left, want the 2 fresh ones", n)
	}
}

// TestJanitorDeletesOnlyOldDoneSegments: done segments go once their done
// time (next_attempt_at) is past the retention, batch by batch, also of a
// pipe that has no outbox rows at all; pending segments, claimed or not,
// stay however old.
func TestJanitorDeletesOnlyOldDoneSegments(t *testing.T) {
	s := newTestState(t)
	segments := state.Table(s.schema, "segments")
	seg := func(pipe, status string, claimer int, doneAgo string) string {
		t.Helper()
		id := nextTestID()
		if _, err := s.db.Exec(`INSERT INTO `+segments+`
(id, pipe, sink, status, records, last_id, claimer, next_attempt_at, first_commit_ts, created_at, payload)
VALUES (?, ?, 'fake', ?, 3, ?, ?, NOW(6) - INTERVAL `+doneAgo+`, NOW(6) - INTERVAL 200 HOUR, NOW(6) - INTERVAL 200 HOUR, 'x')`,
			id, pipe, status, id, claimer); err != nil {
			t.Fatal(err)
		}
		return id
	}
	const pipe, segOnly = "i:app.t:fake", "i:app.s:fake"
	var gone, kept []string
	for range 3 {
		gone = append(gone, seg(pipe, "done", 0, "100 HOUR"))
	}
	kept = append(kept, seg(pipe, "done", 0, "1 HOUR"))       // done recently
	kept = append(kept, seg(pipe, "pending", 0, "100 HOUR"))  // pending, due long ago
	kept = append(kept, seg(pipe, "pending", 42, "100 HOUR")) // pending, claim lapsed long ago
	for range 2 {
		gone = append(gone, seg(segOnly, "done", 0, "100 HOUR"))
	}
	// A row of the first pipe, so that one pipe has both.
	s.insert(t, pipe, `["row"]`)

	j, err := NewJanitor(JanitorConfig{DB: s.db, Schema: s.schema, Retention: 72 * time.Hour, BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	sw, err := j.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sw.Segments != int64(len(gone)) || sw.Rows != 0 {
		t.Fatalf("swept %+v, want %d segments and no rows", sw, len(gone))
	}
	for _, id := range gone {
		if n := s.count(t, `SELECT COUNT(*) FROM `+segments+` WHERE id = ?`, id); n != 0 {
			t.Fatalf("segment %s done 100 hours ago is still there", id)
		}
	}
	for _, id := range kept {
		if n := s.count(t, `SELECT COUNT(*) FROM `+segments+` WHERE id = ?`, id); n != 1 {
			t.Fatalf("segment %s deleted; pending and recently done segments must stay", id)
		}
	}
	if n := s.count(t, `SELECT COUNT(*) FROM `+segments); n != len(kept) {
		t.Fatalf("%d segments left, want %d", n, len(kept))
	}
	if n := s.count(t, `SELECT COUNT(*) FROM {outbox}`); n != 1 {
		t.Fatalf("%d rows left, want the pending one", n)
	}
	// A second sweep finds nothing more.
	if sw, err := j.Sweep(context.Background()); err != nil || sw.Segments != 0 {
		t.Fatalf("second sweep: %+v, %v", sw, err)
	}
}
