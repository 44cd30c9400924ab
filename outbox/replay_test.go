package outbox

import (
	"context"
	"slices"
	"testing"

	"github.com/cdcout/cdcout/state"
)

// TestDeliveredAfter pages through a pipe's done segments for a replay:
// in id order, from inside a segment, up to the newest id given, leaving
// out a record that left its segment and is dead; and finds the oldest
// and newest records.
func TestDeliveredAfter(t *testing.T) {
	st := newTestState(t)
	const pipe = "a:app.users:rp"
	enqueueTxns(t, st, pipe, 3, 5) // three segments of five records
	s := NewStore(st.db, st.schema, nil)
	ctx := context.Background()
	var ids []string
	recs, err := ReadRecords(ctx, st.db, st.schema, pipe)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	if len(ids) != 15 {
		t.Fatalf("%d records, want 15", len(ids))
	}
	newest, err := s.NewestRecordID(ctx, []string{pipe})
	if err != nil || newest != ids[14] {
		t.Fatalf("newest = %q, %v; want %s", newest, err, ids[14])
	}
	// Nothing is done yet: nothing to replay.
	if page, err := s.DeliveredAfter(ctx, pipe, "rp", "", newest, 10); err != nil || len(page.Records) != 0 || !page.Done {
		t.Fatalf("pending segments: %+v, %v", page, err)
	}
	if _, err := st.db.Exec("UPDATE "+state.Table(st.schema, "segments")+" SET status = 'done' WHERE pipe = ?", pipe); err != nil {
		t.Fatal(err)
	}
	// Record 7 (second segment) left as a dead row, record 8 as a
	// delivered one.
	for _, left := range []struct{ id, status string }{{ids[6], "dead"}, {ids[7], "delivered"}} {
		if _, err := st.db.Exec("INSERT INTO "+state.Table(st.schema, "outbox")+
			" (id, pipe, sink, change_key, db, tbl, op, row_key, key_hash, status, commit_ts, payload) VALUES (?, ?, 'rp', 'x', 'app', 'users', 'c', '{}', '', ?, NOW(6), '{}')",
			left.id, pipe, left.status); err != nil {
			t.Fatal(err)
		}
	}
	oldest, ok, err := s.OldestRecord(ctx, pipe)
	if err != nil || !ok || oldest.ID != ids[0] || oldest.CommitTime.IsZero() {
		t.Fatalf("oldest = %+v, %v, %v; want %s", oldest, ok, err, ids[0])
	}
	var got []string
	after := ids[1] // the replay had got through record 2
	for pages := 0; ; pages++ {
		page, err := s.DeliveredAfter(ctx, pipe, "rp", after, ids[12], 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			if r.Pipe != pipe || r.Sink != "rp" || len(r.Payload) == 0 {
				t.Fatalf("record %+v", r)
			}
			got = append(got, r.ID)
		}
		if page.Done {
			break
		}
		if page.Next <= after || pages > 10 {
			t.Fatalf("page after %s ends at %q", after, page.Next)
		}
		after = page.Next
	}
	want := slices.Concat(ids[2:6], ids[7:13])
	if !slices.Equal(got, want) {
		t.Fatalf("replayed\n %v\nwant\n %v", got, want)
	}
}
