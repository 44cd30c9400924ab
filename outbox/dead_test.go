package outbox

import (
	"context"
	"errors"
	"testing"

	"github.com/cdcout/cdcout/sink"
)

func TestDeadListAndRetry(t *testing.T) {
	s := newTestState(t)
	const p1, p2 = "i:app.t:hook", "i:app.t:file"
	a, b := s.insert(t, p1, `[1]`), s.insert(t, p1, `[2]`)
	c := s.insert(t, p2, `[1]`)
	fine := s.insert(t, p1, `[3]`)
	failing := map[string]bool{a: true, b: true, c: true}
	fail := true
	snk := fakeSink{fn: func(_ context.Context, recs []Record) []error {
		errs := make([]error, len(recs))
		for i, r := range recs {
			if fail && failing[r.ID] {
				errs[i] = sink.Permanent(errors.New("HTTP 422 for " + r.Key))
			}
		}
		return errs
	}}
	d := s.drainer(t, "r/1", map[string]PipeConfig{p1: {Sink: snk}, p2: {Sink: snk}}, nil)
	drainUntil(t, d, "rows settled", func() bool {
		return s.count(t, `SELECT COUNT(*) FROM {outbox} WHERE status = 'pending'`) == 0
	})
	ctx := context.Background()
	st := NewStore(s.db, s.schema, nil)
	all, err := st.DeadRows(ctx, DeadQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].ID != a || all[1].ID != b || all[2].ID != c {
		t.Fatalf("DeadRows(all) = %+v", all)
	}
	if r := all[0]; r.Pipe != p1 || r.Sink != "fake" || r.RowKey != `[1]` || r.Attempts != 1 || r.LastError != "HTTP 422 for [1]" ||
		r.LastErrorAt == nil || r.CommitTime == nil || r.CreatedAt.IsZero() || r.Table != "app.t" || r.Op != "u" {
		t.Fatalf("dead row = %+v", r)
	}
	if got, err := st.DeadRows(ctx, DeadQuery{Pipe: p2}); err != nil || len(got) != 1 || got[0].ID != c {
		t.Fatalf("DeadRows(%s) = %+v, %v", p2, got, err)
	}
	if got, err := st.DeadRows(ctx, DeadQuery{Limit: 1}); err != nil || len(got) != 1 {
		t.Fatalf("DeadRows(limit 1) = %d rows, %v", len(got), err)
	}
	// The dashboard's view: by instance prefix, newest first, keys cut.
	if got, err := st.DeadRows(ctx, DeadQuery{Prefix: "i:", NewestFirst: true, KeyChars: 2}); err != nil || len(got) != 3 ||
		got[0].ID != c || got[2].ID != a || got[2].RowKey != `[1` {
		t.Fatalf("DeadRows(prefix i:, newest first, 2 key chars) = %+v, %v", got, err)
	}
	if got, err := st.DeadRows(ctx, DeadQuery{Prefix: "j:"}); err != nil || len(got) != 0 {
		t.Fatalf("DeadRows(prefix j:) = %+v, %v", got, err)
	}

	fail = false
	if n, err := st.RetryDead(ctx, p1, b); err != nil || n != 1 {
		t.Fatalf("RetryDead(id) = %d, %v", n, err)
	}
	if r := s.row(t, b); r.status != "pending" || r.attempts != 0 {
		t.Fatalf("retried row = %+v", r)
	}
	if n, err := st.RetryDead(ctx, p1, fine); err != nil || n != 0 {
		t.Fatalf("RetryDead(delivered row) = %d, %v; want nothing", n, err)
	}
	drainUntil(t, d, "retried row delivered", func() bool { return s.row(t, b).status == "delivered" })
	if r := s.row(t, a); r.status != "dead" {
		t.Fatalf("row not retried = %+v", r)
	}
	if n, err := st.RetryDead(ctx, "", ""); err != nil || n != 2 {
		t.Fatalf("RetryDead(all) = %d, %v", n, err)
	}
	drainUntil(t, d, "all retried rows delivered", func() bool {
		return s.count(t, `SELECT COUNT(*) FROM {outbox} WHERE status <> 'delivered'`) == 0
	})
	// The attempt log restarted at 1 for the retried rows.
	if n := s.count(t, `SELECT COUNT(*) FROM {attempts} WHERE outbox_id = ? AND n = 1 AND error IS NULL`, a); n != 1 {
		t.Fatalf("attempt 1 of the re-delivered row not overwritten with success")
	}
	if got, _ := st.DeadRows(ctx, DeadQuery{}); len(got) != 0 {
		t.Fatalf("dead rows left: %+v", got)
	}
}
