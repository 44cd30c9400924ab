package backfill

import (
	"context"
	"errors"
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/state"
)

// TestReopenEnded: reopening a backfill (Prepare resuming it) changes it
// only while it is running or failed. One cancelled or done between the
// lookup and the reopen stays as it is: a cancel is never undone.
func TestReopenEnded(t *testing.T) {
	srv := mysqltest.Shared(t)
	stateDB := srv.CreateDB(t, "bfreopen_state")
	db := srv.Open(t)
	ctx := context.Background()
	if err := state.Migrate(ctx, db, stateDB); err != nil {
		t.Fatal(err)
	}
	s := newRunStore(db, stateDB)
	for _, tc := range []struct {
		status string
		want   error
	}{{StatusRunning, nil}, {StatusFailed, nil}, {StatusCancelled, errEnded}, {StatusDone, errEnded}} {
		s.id = newID()
		if err := s.create(ctx, Spec{Table: "x.t"}, meta{}, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec("UPDATE "+s.fills+" SET status = ? WHERE id = ?", tc.status, s.id); err != nil {
			t.Fatal(err)
		}
		if err := s.reopen(ctx, 7); !errors.Is(err, tc.want) {
			t.Fatalf("reopen of a %s backfill = %v, want %v", tc.status, err, tc.want)
		}
		info, _, err := get(ctx, db, stateDB, s.id)
		if err != nil {
			t.Fatal(err)
		}
		want := StatusRunning
		if tc.want != nil {
			want = tc.status
		}
		if info.Status != want {
			t.Errorf("a %s backfill after reopen reads %s, want %s", tc.status, info.Status, want)
		}
	}
}
