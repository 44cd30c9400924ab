package outbox

import (
	"context"
	"testing"

	"github.com/cdcout/cdcout/state"
)

// TestReleaseClaims: a stopping process releases what it claimed (the
// attempt given back); a new drain lease holder releases the claims of
// processes that are gone (the attempt kept). Claims of live members,
// unclaimed rows and other pipes are left alone.
func TestReleaseClaims(t *testing.T) {
	s := newTestState(t)
	st := NewStore(s.db, s.schema, nil)
	ctx := context.Background()
	const pipe, other = "i:app.t:hook", "i:app.u:hook"
	claim := func(id, by string) {
		s.exec(t, `UPDATE {outbox} SET claimer = ?, attempts = 1, next_attempt_at = NOW(6) + INTERVAL 1 MINUTE WHERE id = ?`, ClaimerID(by), id)
	}
	mine, gone, live, free, elsewhere := s.insert(t, pipe, `[1]`), s.insert(t, pipe, `[2]`), s.insert(t, pipe, `[3]`), s.insert(t, pipe, `[4]`), s.insert(t, other, `[1]`)
	claim(mine, "me/1")
	claim(gone, "gone/1")
	claim(live, "live/1")
	claim(elsewhere, "gone/1")
	segID := nextTestID()
	if _, err := s.db.Exec(`INSERT INTO `+state.Table(s.schema, "segments")+` (id, pipe, sink, status, records, last_id, claimer, attempts, next_attempt_at, first_commit_ts, payload)
VALUES (?, ?, 'hook', 'pending', 1, ?, ?, 1, NOW(6) + INTERVAL 1 MINUTE, NOW(6), '')`, segID, pipe, segID, ClaimerID("gone/1")); err != nil {
		t.Fatal(err)
	}

	if n, err := st.ReleaseClaimsExcept(ctx, pipe, []string{"me/1", "live/1"}); err != nil || n != 2 {
		t.Fatalf("ReleaseClaimsExcept = %d, %v; want the gone replica's row and segment", n, err)
	}
	if r := s.row(t, gone); r.status != "pending" || r.claimer != 0 || r.attempts != 1 {
		t.Fatalf("gone replica's row = %+v, want pending, unclaimed, its attempt kept", r)
	}
	if n := s.count(t, `SELECT COUNT(*) FROM {segments} WHERE id = ? AND claimer = 0 AND attempts = 1 AND next_attempt_at <= NOW(6)`, segID); n != 1 {
		t.Fatalf("gone replica's segment not released")
	}
	for _, id := range []string{mine, live, elsewhere} {
		if r := s.row(t, id); r.status != "delivering" {
			t.Fatalf("row %s = %+v, want still claimed", id, r)
		}
	}
	if n, err := st.ReleaseClaimsExcept(ctx, pipe, nil); err != nil || n != 0 {
		t.Fatalf("ReleaseClaimsExcept(no members) = %d, %v; want nothing released", n, err)
	}

	if n, err := st.ReleaseClaimsOf(ctx, "me/1", []string{pipe, other}); err != nil || n != 1 {
		t.Fatalf("ReleaseClaimsOf = %d, %v; want our one row", n, err)
	}
	if r := s.row(t, mine); r.status != "pending" || r.claimer != 0 || r.attempts != 0 {
		t.Fatalf("our row = %+v, want pending, unclaimed, the attempt given back", r)
	}
	if r := s.row(t, free); r.status != "pending" || r.attempts != 0 {
		t.Fatalf("unclaimed row = %+v, want untouched", r)
	}
	if n, err := st.ReleaseClaimsOf(ctx, "me/1", nil); err != nil || n != 0 {
		t.Fatalf("ReleaseClaimsOf(no pipes) = %d, %v", n, err)
	}
}
