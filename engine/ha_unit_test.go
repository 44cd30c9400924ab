package engine

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
)

func TestFairShare(t *testing.T) {
	for _, c := range []struct{ pipes, members, want int }{
		{0, 3, 0}, {1, 3, 1}, {3, 3, 1}, {4, 3, 2}, {3, 1, 3}, {3, 2, 2}, {7, 2, 4}, {5, 0, 5},
	} {
		if got := fairShare(c.pipes, c.members); got != c.want {
			t.Errorf("fairShare(%d, %d) = %d, want %d", c.pipes, c.members, got, c.want)
		}
	}
}

// simulate runs planDrainLeases for a fleet until nothing changes, the
// way replicas tick: each in turn, seeing the others' current holdings.
func simulate(t *testing.T, pipes []string, owner map[string]string, members []string) map[string]string {
	t.Helper()
	prefOf := func(r string) func(string) uint64 {
		return func(p string) uint64 {
			h := fnv.New64a()
			h.Write([]byte(r + "\x00" + p))
			return h.Sum64()
		}
	}
	live := map[string]bool{}
	for _, m := range members {
		live[m] = true
	}
	for p, o := range owner {
		if !live[o] {
			delete(owner, p) // a dead member's lease expired
		}
	}
	for round := 0; round < 20; round++ {
		changed := false
		for _, m := range members {
			held, free := map[string]bool{}, map[string]bool{}
			for _, p := range pipes {
				switch owner[p] {
				case m:
					held[p] = true
					free[p] = true
				case "":
					free[p] = true
				}
			}
			release, want := planDrainLeases(pipes, held, free, len(members), prefOf(m))
			for _, p := range release {
				delete(owner, p)
				changed = true
			}
			for _, p := range want {
				owner[p] = m
				changed = true
			}
		}
		if !changed {
			return owner
		}
	}
	t.Fatalf("no stable assignment after 20 rounds: %v", owner)
	return nil
}

func countBy(owner map[string]string) map[string]int {
	n := map[string]int{}
	for _, o := range owner {
		n[o]++
	}
	return n
}

func TestDrainLeasesRebalanceOnJoinAndLeave(t *testing.T) {
	var pipes []string
	for i := range 7 {
		pipes = append(pipes, fmt.Sprintf("i:db.t%d:webhook", i))
	}
	owner := simulate(t, pipes, map[string]string{}, []string{"a"})
	if got, want := countBy(owner)["a"], 7; got != want {
		t.Fatalf("one replica holds %d pipes, want %d", got, want)
	}
	// b joins: a releases its extras, b takes them.
	owner = simulate(t, pipes, owner, []string{"a", "b"})
	n := countBy(owner)
	if len(owner) != 7 || n["a"] > 4 || n["b"] > 4 || n["b"] < 3 {
		t.Fatalf("after b joined: %v (%d assigned)", n, len(owner))
	}
	// c joins: nobody above ceil(7/3) = 3, every pipe held.
	owner = simulate(t, pipes, owner, []string{"a", "b", "c"})
	n = countBy(owner)
	if len(owner) != 7 || n["a"] > 3 || n["b"] > 3 || n["c"] > 3 || n["c"] == 0 {
		t.Fatalf("after c joined: %v (%d assigned)", n, len(owner))
	}
	// a dies: its pipes are taken by b and c (ceil(7/2) = 4 each at most).
	owner = simulate(t, pipes, owner, []string{"b", "c"})
	n = countBy(owner)
	if len(owner) != 7 || n["a"] != 0 || n["b"] > 4 || n["c"] > 4 {
		t.Fatalf("after a left: %v (%d assigned)", n, len(owner))
	}
}

func TestPlanDrainLeasesReleasesLeastPreferred(t *testing.T) {
	pipes := []string{"p1", "p2", "p3", "p4"}
	held := map[string]bool{"p1": true, "p2": true, "p3": true, "p4": true}
	pref := func(p string) uint64 { return uint64(p[1]) }
	release, want := planDrainLeases(pipes, held, held, 2, pref)
	if !slices.Equal(release, []string{"p3", "p4"}) || want != nil {
		t.Fatalf("release %v want %v; want release [p3 p4]", release, want)
	}
	// Room for two, one held by another replica (not free).
	release, want = planDrainLeases(pipes, map[string]bool{}, map[string]bool{"p2": true, "p3": true, "p4": true}, 2, pref)
	if release != nil || !slices.Equal(want, []string{"p2", "p3"}) {
		t.Fatalf("release %v want %v; want acquire [p2 p3]", release, want)
	}
}

// feed plays transactions of n rows each, with GTIDs 0-1-(from+i), into h.
func feed(t *testing.T, h *handoff, from, txs, rows int) {
	t.Helper()
	for i := range txs {
		seq := from + i
		for r := range rows {
			ch := &canonical.Change{}
			ch.Source.Row = r
			ch.ChangeKey = fmt.Sprintf("g:0-1-%d:%d", seq, r)
			if err := h.handle(t.Context(), binlog.Event{Change: ch}); err != nil {
				t.Fatal(err)
			}
		}
		c := &binlog.Commit{Pos: binlog.Position{Flavor: "mariadb", GTIDSet: fmt.Sprintf("0-1-%d", seq)}, GTID: fmt.Sprintf("0-1-%d", seq), Rows: rows}
		if err := h.handle(t.Context(), binlog.Event{Commit: c}); err != nil {
			t.Fatal(err)
		}
	}
}

func gtidPos(seq int) binlog.Position {
	return binlog.Position{Flavor: "mariadb", GTIDSet: fmt.Sprintf("0-1-%d", seq)}
}

func TestHandoffCoversCheckpoint(t *testing.T) {
	h := newHandoff(time.Hour, 100)
	h.begin(gtidPos(10))
	feed(t, h, 11, 5, 3) // 11..15, 4 entries each
	evs, resume, n, ok := h.after(gtidPos(12))
	if !ok {
		t.Fatal("buffer from 10 does not cover checkpoint 12")
	}
	if n != 3 || len(evs) != 12 || resume.GTIDSet != "0-1-15" {
		t.Fatalf("after(12): %d transactions, %d events, resume %v; want 3, 12, 0-1-15", n, len(evs), resume)
	}
	if got := evs[0].Change.ChangeKey; got != "g:0-1-13:0" {
		t.Fatalf("first buffered change %s, want g:0-1-13:0", got)
	}
	// A checkpoint before the stream's start is not covered.
	if _, _, _, ok := h.after(gtidPos(9)); ok {
		t.Fatal("buffer from 10 claims to cover checkpoint 9")
	}
	// A checkpoint ahead of what the standby read is not covered either.
	if _, _, _, ok := h.after(gtidPos(16)); ok {
		t.Fatal("buffer up to 15 claims to cover checkpoint 16")
	}
}

func TestHandoffOverflowFallsBackToReread(t *testing.T) {
	h := newHandoff(time.Hour, 10)
	h.begin(gtidPos(0))
	feed(t, h, 1, 10, 2) // 30 entries through a 10-entry buffer
	if _, _, _, ok := h.after(gtidPos(1)); ok {
		t.Fatal("an overflowed buffer claims to cover an early checkpoint")
	}
	if h.droppedPending() == 0 {
		t.Fatal("overflow dropped nothing pending")
	}
	// It still covers a recent checkpoint: the last 3 transactions are held.
	if _, _, n, ok := h.after(gtidPos(8)); !ok || n != 2 {
		t.Fatalf("after(8) = %d, %v; want 2 transactions, covered", n, ok)
	}
	// Marked by the leader's checkpoint: evicting those is no loss.
	h2 := newHandoff(time.Hour, 10)
	h2.begin(gtidPos(0))
	feed(t, h2, 1, 3, 2)
	h2.markCheckpoint(gtidPos(3))
	feed(t, h2, 4, 3, 2)
	if got := h2.droppedPending(); got != 0 {
		t.Fatalf("droppedPending %d after evicting only checkpointed entries, want 0", got)
	}
}

func TestHandoffHugeTransactionIsAGap(t *testing.T) {
	h := newHandoff(time.Hour, 10)
	h.begin(gtidPos(0))
	feed(t, h, 1, 1, 2)
	feed(t, h, 2, 1, 50) // too big to keep
	feed(t, h, 3, 1, 2)
	if _, _, _, ok := h.after(gtidPos(1)); ok {
		t.Fatal("a buffer missing transaction 2's rows claims to cover checkpoint 1")
	}
	if got := h.droppedPending(); got != 50 {
		t.Fatalf("droppedPending %d, want the huge transaction's 50 rows", got)
	}
	if _, _, n, ok := h.after(gtidPos(2)); !ok || n != 1 {
		t.Fatalf("after(2) = %d, %v; want 1 transaction, covered", n, ok)
	}
	// A replay from the first row after a reconnect is not kept twice.
	h3 := newHandoff(time.Hour, 100)
	h3.begin(gtidPos(0))
	for _, r := range []int{0, 1, 0, 1, 2} {
		ch := &canonical.Change{}
		ch.Source.Row = r
		_ = h3.handle(t.Context(), binlog.Event{Change: ch})
	}
	_ = h3.handle(t.Context(), binlog.Event{Commit: &binlog.Commit{Pos: gtidPos(1)}})
	if evs, _, _, ok := h3.after(gtidPos(0)); !ok || len(evs) != 4 {
		t.Fatalf("replayed transaction: %d events, %v; want 3 rows + commit", len(evs), ok)
	}
}

// TestTransient: a lost connection is retried; a purged checkpoint
// position is not, even when the same error also carries a lost
// connection; an error is never classified by its text. The errors real
// servers return are classified in state.TestErrorClassesFromRealServers.
func TestTransient(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("enqueue: %w", mysql.ErrInvalidConn), true},
		{fmt.Errorf("read checkpoint: %w", &mysql.MySQLError{Number: 1053, Message: "Server shutdown in progress"}), true},
		{fmt.Errorf("%w: %w", binlog.ErrPositionUnavailable, io.ErrUnexpectedEOF), false},
		{&mysql.MySQLError{Number: 1064, Message: "syntax error"}, false},
		{errors.New("write: connection reset by peer"), false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
