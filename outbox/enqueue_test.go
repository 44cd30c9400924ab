package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/dedup"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/state"
)

func TestEnqueueWritesRowsClaimsAndCheckpoint(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	fence := grantLease(t, db, schema, "enqueue/a", "r1", 7, time.Hour)
	pipes := []string{"a:app.users:hook", "a:app.users:file"}
	var items []Pending
	for i := 0; i < 3; i++ {
		for _, p := range pipes {
			items = append(items, gtidItem(p, 5, i))
		}
	}
	// Deletes and keyless tables go through too.
	del := gtidItem(pipes[0], 6, 0)
	del.Change.Op, del.Change.Before, del.Change.After, del.Change.Key = canonical.OpDelete, del.Change.After, nil, nil
	del.Digest = canonical.Digest(del.Pipe, del.Change.Op, nil, nil, del.Change.Before)
	items = append(items, del)

	cp := &Checkpoint{Source: "enqueue/a", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-6"}}
	res, err := s.Enqueue(ctx, "r1", fence, items, cp)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != len(items) || res.AlreadyOurs != 0 || res.OthersClaims != 0 || res.DigestMismatches != 0 {
		t.Fatalf("result = %+v, want %d inserted", res, len(items))
	}
	if got, want := strings.Join(res.Pipes, ","), strings.Join(pipes, ","); got != want {
		t.Fatalf("Pipes = %s, want %s", got, want)
	}

	recs := records(t, db, schema)
	claims := claimsOf(t, db, schema)
	if len(recs) != len(items) {
		t.Fatalf("%d records, want %d", len(recs), len(items))
	}
	// Records are in segments, one per pipe, in item order within each.
	byPipe := map[string][]StoredRecord{}
	for _, r := range recs {
		byPipe[r.Pipe] = append(byPipe[r.Pipe], r)
	}
	keyless := 0
	for _, pipe := range pipes {
		var want []Pending
		for _, it := range items {
			if it.Pipe == pipe {
				want = append(want, it)
			}
		}
		got := byPipe[pipe]
		if len(got) != len(want) {
			t.Fatalf("pipe %s: %d records, want %d", pipe, len(got), len(want))
		}
		for n, r := range got {
			w := want[n]
			if r.ChangeKey != w.ChangeKey || r.Sink != sinkOf(pipe) || r.DB != "app" || r.Table != "users" || r.Op != string(w.Change.Op) {
				t.Fatalf("pipe %s record %d = %+v, want item %+v", pipe, n, r, w)
			}
			if r.InSegment == "" || r.Status != "pending" {
				t.Fatalf("pipe %s record %d: segment %q status %s, want a pending segment's record", pipe, n, r.InSegment, r.Status)
			}
			if wantKey := canonical.KeyJSON(w.Change.Key); r.Key != wantKey {
				t.Fatalf("record %d row_key = %s, want %s", n, r.Key, wantKey)
			}
			if r.Key == "null" {
				keyless++
			}
			c := claims[[2]string{pipe, r.ChangeKey}]
			if c.outboxID != r.ID || c.claimedBy != "r1" || c.digest != w.Digest {
				t.Fatalf("record %d claim = %+v, want %s r1 %s", n, c, r.ID, w.Digest)
			}
			ch, envID, err := canonical.UnmarshalEnvelope(r.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if envID != r.ID || ch.ChangeKey != r.ChangeKey || ch.Op != w.Change.Op || ch.Source.GTID != w.Change.Source.GTID {
				t.Fatalf("record %d envelope id %s change_key %s op %s, want %s %s %s", n, envID, ch.ChangeKey, ch.Op, r.ID, r.ChangeKey, w.Change.Op)
			}
			if n > 0 && r.ID <= got[n-1].ID {
				t.Fatalf("pipe %s: record ids out of order: %s after %s", pipe, r.ID, got[n-1].ID)
			}
		}
	}
	if keyless != 1 {
		t.Fatalf("keyless records = %d, want 1", keyless)
	}
	if segs := count(t, db, "SELECT COUNT(*) FROM "+state.Table(schema, "segments")); segs != len(pipes) {
		t.Fatalf("%d segments, want one per pipe (%d)", segs, len(pipes))
	}
	if rows := count(t, db, "SELECT COUNT(*) FROM "+state.Table(schema, "outbox")); rows != 0 {
		t.Fatalf("%d outbox rows, want none (records are in segments)", rows)
	}
	pos, err := s.LoadCheckpoint(ctx, "enqueue/a")
	if err != nil || pos == nil || *pos != cp.Pos {
		t.Fatalf("checkpoint = %+v, %v; want %+v", pos, err, cp.Pos)
	}
}

func TestEnqueueReplayWritesNothingNew(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	var items []Pending
	for i := 0; i < 50; i++ {
		items = append(items, gtidItem("a:app.users:hook", 1, i))
	}
	if _, err := s.Enqueue(ctx, "r1", Fence{}, items[:30], nil); err != nil {
		t.Fatal(err)
	}
	// A replay after a crash overlaps what was written.
	res, err := s.Enqueue(ctx, "r1", Fence{}, items, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 20 || res.AlreadyOurs != 30 || res.OthersClaims != 0 {
		t.Fatalf("replay result = %+v, want 20 inserted, 30 already ours", res)
	}
	res, err = s.Enqueue(ctx, "r1", Fence{}, items, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 0 || res.AlreadyOurs != 50 || len(res.Pipes) != 0 {
		t.Fatalf("second replay = %+v, want 0 inserted", res)
	}
	if got := len(records(t, db, schema)); got != 50 {
		t.Fatalf("outbox records = %d, want 50", got)
	}
	// The same change twice in one batch is one row.
	dup := gtidItem("a:app.users:hook", 2, 0)
	res, err = s.Enqueue(ctx, "r1", Fence{}, []Pending{dup, dup}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 1 || res.AlreadyOurs != 1 {
		t.Fatalf("duplicate in batch = %+v, want 1 inserted, 1 already ours", res)
	}
}

// Two replicas enqueue the same changes at the same time, in batches that
// do not line up: every (pipe, change_key) ends with exactly one row.
func TestEnqueueRacingReplicasOneRowEach(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	const n = 2000
	pipes := []string{"a:app.users:hook", "a:app.users:file"}
	var items []Pending
	for i := 0; i < n; i++ {
		items = append(items, gtidItem(pipes[i%2], i/10, i%10))
	}
	results := make([]EnqueueResult, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for r, batch := range []int{70, 130} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < n; i += batch {
				res, err := s.Enqueue(ctx, fmt.Sprint("r", r), Fence{}, items[i:min(i+batch, n)], nil)
				if err != nil {
					errs[r] = err
					return
				}
				results[r].Records += res.Records
				results[r].OthersClaims += res.OthersClaims
				results[r].AlreadyOurs += res.AlreadyOurs
				results[r].DigestMismatches += res.DigestMismatches
			}
		}()
	}
	close(start)
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", r, err)
		}
	}
	if got := results[0].Records + results[1].Records; got != n {
		t.Fatalf("inserted %d + %d, want %d in total", results[0].Records, results[1].Records, n)
	}
	for r, res := range results {
		if res.Records+res.OthersClaims != n || res.DigestMismatches != 0 {
			t.Fatalf("replica %d: %+v", r, res)
		}
	}
	recs := records(t, db, schema)
	if len(recs) != n {
		t.Fatalf("outbox records = %d, want %d", len(recs), n)
	}
	byKey := map[[2]string]StoredRecord{}
	for _, r := range recs {
		k := [2]string{r.Pipe, r.ChangeKey}
		if _, dup := byKey[k]; dup {
			t.Fatalf("(%s, %s) has more than one record", r.Pipe, r.ChangeKey)
		}
		byKey[k] = r
	}
	// Every record belongs to the replica whose claim won.
	claims := claimsOf(t, db, schema)
	if len(claims) != n {
		t.Fatalf("%d claims, want %d", len(claims), n)
	}
	for k, c := range claims {
		if r, ok := byKey[k]; !ok || r.ID != c.outboxID {
			t.Fatalf("claim %v (outbox id %s, by %s) without its record", k, c.outboxID, c.claimedBy)
		}
	}
}

// A claim this replica took earlier without writing its row (the seeds'
// claim-then-insert failure) is finished by the same replica, while another
// replica's such claim is left to its owner.
func TestEnqueueReentrantClaim(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	mine, theirs := gtidItem("a:app.users:hook", 1, 0), gtidItem("a:app.users:hook", 1, 1)
	for _, c := range []struct {
		p  Pending
		by string
	}{{mine, "me"}, {theirs, "other"}} {
		if _, err := db.Exec("INSERT INTO "+state.Table(schema, "claims")+" (pipe, change_key, digest, claimed_by, outbox_id) VALUES (?, ?, ?, ?, NULL)",
			c.p.Pipe, c.p.ChangeKey, c.p.Digest, c.by); err != nil {
			t.Fatal(err)
		}
	}
	res, err := s.Enqueue(ctx, "me", Fence{}, []Pending{mine, theirs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 1 || res.OthersClaims != 1 || res.AlreadyOurs != 0 {
		t.Fatalf("result = %+v, want 1 inserted, 1 others'", res)
	}
	recs := records(t, db, schema)
	if len(recs) != 1 || recs[0].ChangeKey != mine.ChangeKey {
		t.Fatalf("records = %+v, want only the re-entrant claim's (none for another replica's claim)", recs)
	}
	if linked := claimsOf(t, db, schema)[[2]string{mine.Pipe, mine.ChangeKey}].outboxID; linked != recs[0].ID {
		t.Fatalf("claim links %s, record is %s", linked, recs[0].ID)
	}
	// Finished once, it is not written again.
	res, err = s.Enqueue(ctx, "me", Fence{}, []Pending{mine}, nil)
	if err != nil || res.Records != 0 || res.AlreadyOurs != 1 {
		t.Fatalf("again = %+v, %v", res, err)
	}
}

func TestEnqueueFencedCommitsNothing(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	good := grantLease(t, db, schema, "enqueue/a", "r1", 5, time.Hour)
	if got := FenceOf(lease.Lease{Name: "enqueue/a", Holder: "r1", Epoch: 5}); got != good {
		t.Fatalf("FenceOf = %+v, want %+v", got, good)
	}
	var items []Pending
	for i := 0; i < 700; i++ { // more than one statement's worth
		items = append(items, gtidItem("a:app.users:hook", 3, i))
	}
	cp := &Checkpoint{Source: "enqueue/a", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-3"}}
	empty := func(when string) {
		t.Helper()
		for _, tbl := range []string{"claims", "outbox", "segments", "checkpoints"} {
			if got := count(t, db, "SELECT COUNT(*) FROM "+state.Table(schema, tbl)); got != 0 {
				t.Fatalf("%s: %s has %d rows after a fenced enqueue", when, tbl, got)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		fence Fence
	}{
		{"old epoch", Fence{Lease: "enqueue/a", Holder: "r1", Epoch: 4}},
		{"other holder", Fence{Lease: "enqueue/a", Holder: "r2", Epoch: 5}},
		{"no such lease", Fence{Lease: "enqueue/b", Holder: "r1", Epoch: 5}},
	} {
		_, err := s.Enqueue(ctx, "r1", tc.fence, items, cp)
		if !errors.Is(err, ErrFenced) || !errors.Is(err, lease.ErrNotHeld) {
			t.Fatalf("%s: err = %v, want ErrFenced (and lease.ErrNotHeld)", tc.name, err)
		}
		empty(tc.name)
	}
	// Expired on the database clock.
	grantLease(t, db, schema, "enqueue/a", "r1", 5, -time.Second)
	if _, err := s.Enqueue(ctx, "r1", good, items, cp); !errors.Is(err, ErrFenced) {
		t.Fatalf("expired lease: err = %v, want ErrFenced", err)
	}
	empty("expired lease")

	grantLease(t, db, schema, "enqueue/a", "r1", 5, time.Hour)
	if res, err := s.Enqueue(ctx, "r1", good, items, cp); err != nil || res.Records != len(items) {
		t.Fatalf("with the lease: %+v, %v", res, err)
	}
	// A takeover: the old holder's next enqueue is fenced and leaves the
	// new leader's state alone.
	grantLease(t, db, schema, "enqueue/a", "r2", 6, time.Hour)
	more := []Pending{gtidItem("a:app.users:hook", 4, 0)}
	later := &Checkpoint{Source: "enqueue/a", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-4"}}
	if _, err := s.Enqueue(ctx, "r1", good, more, later); !errors.Is(err, ErrFenced) {
		t.Fatalf("after takeover: err = %v, want ErrFenced", err)
	}
	if got := count(t, db, "SELECT COUNT(*) FROM "+state.Table(schema, "claims")+" WHERE change_key = ?", more[0].ChangeKey); got != 0 {
		t.Fatalf("fenced enqueue left its claim behind")
	}
	pos, err := s.LoadCheckpoint(ctx, "enqueue/a")
	if err != nil || pos.GTIDSet != "0-1-3" {
		t.Fatalf("checkpoint after fenced write = %+v, %v; want 0-1-3", pos, err)
	}
}

// A takeover waits for an in-flight enqueue of the old holder to finish: the
// lease check and the commit are not separable.
func TestEnqueueTakeoverWaitsForInflightEnqueue(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	fence := grantLease(t, db, schema, "enqueue/a", "r1", 1, time.Hour)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := s.advanceCheckpoint(ctx, tx, fence, &Checkpoint{Source: "enqueue/a", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-1"}}); err != nil {
		t.Fatal(err)
	}
	took := make(chan error, 1)
	go func() {
		_, err := db.Exec("UPDATE " + state.Table(schema, "leases") + " SET holder = 'r2', epoch = epoch + 1 WHERE name = 'enqueue/a'")
		took <- err
	}()
	select {
	case err := <-took:
		t.Fatalf("takeover went through while the old holder's enqueue was open (err %v)", err)
	case <-time.After(300 * time.Millisecond):
		// Still blocked, as it must be. (A bounded wait for a thing that
		// must NOT happen; the positive case below polls.)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-took; err != nil {
		t.Fatal(err)
	}
}

func TestEnqueueDigestMismatchCounted(t *testing.T) {
	s, _, _ := testStore(t)
	ctx := context.Background()
	a := gtidItem("a:app.users:hook", 1, 0)
	if _, err := s.Enqueue(ctx, "r1", Fence{}, []Pending{a}, nil); err != nil {
		t.Fatal(err)
	}
	same := a
	res, err := s.Enqueue(ctx, "r2", Fence{}, []Pending{same}, nil)
	if err != nil || res.OthersClaims != 1 || res.DigestMismatches != 0 {
		t.Fatalf("same digest: %+v, %v", res, err)
	}
	// r2 decoded the same change differently.
	drifted := a
	drifted.Digest = strings.Repeat("e", 64)
	res, err = s.Enqueue(ctx, "r2", Fence{}, []Pending{drifted}, nil)
	if err != nil || res.OthersClaims != 1 || res.DigestMismatches != 1 || res.Records != 0 {
		t.Fatalf("drifted digest: %+v, %v; want 1 mismatch, 0 inserted", res, err)
	}
}

func TestEnqueueRejectsBadItems(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	good := gtidItem("a:app.users:hook", 1, 0)
	for _, tc := range []struct {
		name string
		mod  func(p *Pending)
	}{
		{"long change key", func(p *Pending) { p.ChangeKey = "g:" + strings.Repeat("9", 190) + ":0" }},
		{"no digest", func(p *Pending) { p.Digest = "" }},
		{"no change", func(p *Pending) { p.Change = nil }},
		{"no pipe", func(p *Pending) { p.Pipe = "" }},
		{"space in key", func(p *Pending) { p.ChangeKey = "g:0-1-1 :0" }},
		{"long pipe", func(p *Pending) { p.Pipe = strings.Repeat("p", 256) }},
		{"long sink", func(p *Pending) { p.Sink = strings.Repeat("é", 129) }},
		{"long table", func(p *Pending) { c := *p.Change; c.Source.Table = strings.Repeat("t", 65); p.Change = &c }},
		{"long database", func(p *Pending) { c := *p.Change; c.Source.DB = strings.Repeat("d", 65); p.Change = &c }},
	} {
		p := good
		tc.mod(&p)
		if _, err := s.Enqueue(ctx, "r1", Fence{}, []Pending{good, p}, nil); err == nil {
			t.Fatalf("%s: accepted", tc.name)
		}
	}
	if _, err := s.Enqueue(ctx, "", Fence{}, []Pending{good}, nil); err == nil {
		t.Fatal("empty claimedBy accepted")
	}
	if _, err := s.Enqueue(ctx, "r1", Fence{}, nil, &Checkpoint{Source: "enqueue/a"}); err == nil {
		t.Fatal("checkpoint without a fence accepted")
	}
	if got := count(t, db, "SELECT COUNT(*) FROM "+state.Table(schema, "claims")); got != 0 {
		t.Fatalf("rejected batches left %d claims", got)
	}
	// Lengths are characters, not bytes: 64 two-byte characters are a
	// table name MySQL allows.
	wide := gtidItem("a:app.users:hook", 2, 0)
	c := *wide.Change
	c.Source.Table, c.Source.DB = strings.Repeat("é", 64), strings.Repeat("ü", 64)
	wide.Change, wide.Sink = &c, strings.Repeat("ß", 128)
	if _, err := s.Enqueue(ctx, "r1", Fence{}, []Pending{wide}, nil); err != nil {
		t.Fatalf("64-character names of 2-byte characters: %v", err)
	}
}

// One enqueue of 10,000 changes: all rows, ids increasing in item order,
// written in bounded statements (counted on the server).
func TestEnqueueLargeBatchChunked(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	fence := grantLease(t, db, schema, "enqueue/a", "r1", 1, time.Hour)
	const n = 10_000
	items := make([]Pending, n)
	for i := range items {
		items[i] = gtidItem("a:app.big:hook", 1, i)
	}
	before := comInsert(t, s)
	res, err := s.Enqueue(ctx, "r1", fence, items, &Checkpoint{Source: "enqueue/a", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != n {
		t.Fatalf("inserted %d, want %d", res.Records, n)
	}
	// 20 claim statements + 10 segments + the checkpoint.
	want := n/maxRowsPerStatement + n/maxSegmentRecords
	if got := comInsert(t, s) - before; got < want || got > want+5 {
		t.Fatalf("%d INSERT statements for %d items, want about %d", got, n, want)
	}
	if segs := count(t, db, "SELECT COUNT(*) FROM "+state.Table(schema, "segments")); segs != n/maxSegmentRecords {
		t.Fatalf("%d segments, want %d", segs, n/maxSegmentRecords)
	}
	recs := records(t, db, schema)
	for i, r := range recs {
		if r.ChangeKey != items[i].ChangeKey {
			t.Fatalf("record %d in id order is %s, want %s: ids do not follow item order", i, r.ChangeKey, items[i].ChangeKey)
		}
		if i > 0 && r.ID <= recs[i-1].ID {
			t.Fatalf("record %d id %s not after %s", i, r.ID, recs[i-1].ID)
		}
	}
	if len(recs) != n {
		t.Fatalf("%d records, want %d", len(recs), n)
	}
}

// Payloads larger than one packet in total are split by bytes, not only
// by rows: with the server's max_allowed_packet at 8 MiB, 20 MiB of rows
// must still go in.
func TestEnqueueSplitsByBytes(t *testing.T) {
	_, admin, schema := testStore(t)
	var was int64
	if err := admin.QueryRow("SELECT @@GLOBAL.max_allowed_packet").Scan(&was); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec("SET GLOBAL max_allowed_packet = 8388608"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec("SET GLOBAL max_allowed_packet = ?", was) })
	// A pool opened now gets the small packet limit in its sessions. With
	// interpolateParams the statement is one packet (server-side prepared
	// statements would stream big values separately and hide the limit).
	db, err := sql.Open("mysql", mysqltest.Shared(t).DSN+"&interpolateParams=true")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := NewStore(db, schema, zaptest.NewLogger(t))

	big := strings.Repeat("x", 512<<10)
	var items []Pending
	for i := 0; i < 40; i++ {
		p := gtidItem("a:app.blobs:hook", 1, i)
		p.Change.After["data"] = big
		items = append(items, p)
	}
	res, err := s.Enqueue(context.Background(), "r1", Fence{}, items, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != len(items) {
		t.Fatalf("inserted %d, want %d", res.Records, len(items))
	}
	full := 0
	for _, r := range records(t, db, schema) {
		if len(r.Payload) > len(big) {
			full++
		}
	}
	if full != len(items) {
		t.Fatalf("%d full payloads, want %d", full, len(items))
	}
	// 20 MiB cannot be one segment under an 8 MiB packet limit.
	if segs := count(t, db, "SELECT COUNT(*) FROM "+state.Table(schema, "segments")); segs < 5 {
		t.Fatalf("%d segments for 20 MiB, want them split by bytes (at least 5)", segs)
	}
}

// comInsert is the server's count of INSERT statements. Tests in this
// package do not run in parallel, so a difference is this test's.
func comInsert(t testing.TB, s *Store) int {
	t.Helper()
	var name string
	var n int
	if err := s.db.QueryRow("SHOW GLOBAL STATUS LIKE 'Com_insert'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func BenchmarkEnqueue(b *testing.B) {
	s, db, schema := testStore(b)
	s.logger = zap.NewNop()
	ctx := context.Background()
	fence := grantLease(b, db, schema, "enqueue/bench", "r1", 1, time.Hour)
	const batch = 500
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		items := make([]Pending, batch)
		for j := range items {
			items[j] = gtidItem("a:app.users:hook", i, j)
		}
		cp := &Checkpoint{Source: "enqueue/bench", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: fmt.Sprint("0-1-", i)}}
		b.StartTimer()
		if _, err := s.Enqueue(ctx, "r1", fence, items, cp); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "rows/s")
}

// records is ReadRecords of the whole state database.
func records(tb testing.TB, db *sql.DB, schema string) []StoredRecord {
	tb.Helper()
	recs, err := ReadRecords(context.Background(), db, schema, "%")
	if err != nil {
		tb.Fatal(err)
	}
	return recs
}

type claimRow struct{ claimedBy, digest, outboxID string }

// claimsOf reads every claim by (pipe, change_key).
func claimsOf(tb testing.TB, db *sql.DB, schema string) map[[2]string]claimRow {
	tb.Helper()
	rows, err := db.Query("SELECT pipe, change_key, claimed_by, digest, COALESCE(outbox_id, '') FROM " + state.Table(schema, "claims"))
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	out := map[[2]string]claimRow{}
	for rows.Next() {
		var pipe, key string
		var c claimRow
		if err := rows.Scan(&pipe, &key, &c.claimedBy, &c.digest, &c.outboxID); err != nil {
			tb.Fatal(err)
		}
		out[[2]string{pipe, key}] = c
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// Changes that share a unit take one claim per pipe and unit, and a
// replay, or another replica, meets the unit as a whole.
func TestEnqueueUnitsShareOneClaim(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	pipes := []string{"a:app.users:hook", "a:app.users:file"}
	var items []Pending
	for i := 0; i < 2500; i++ {
		for _, p := range pipes {
			it := gtidItem(p, 9, i)
			it.Unit = fmt.Sprintf("g:0-1-9:@%d", i/1000)
			items = append(items, it)
		}
	}
	res, err := s.Enqueue(ctx, "r1", Fence{}, items, nil)
	if err != nil || res.Records != len(items) {
		t.Fatalf("enqueue = %+v, %v; want %d inserted", res, err, len(items))
	}
	claims := claimsOf(t, db, schema)
	if len(claims) != 6 {
		t.Fatalf("%d claims, want 6 (3 blocks × 2 pipes)", len(claims))
	}
	recs := records(t, db, schema)
	first := map[[2]string]string{}
	for _, r := range recs {
		var i int
		fmt.Sscanf(r.ChangeKey, "g:0-1-9:%d", &i)
		k := [2]string{r.Pipe, fmt.Sprintf("g:0-1-9:@%d", i/1000)}
		if _, ok := first[k]; !ok || r.ID < first[k] {
			first[k] = r.ID
		}
	}
	for k, c := range claims {
		if c.outboxID != first[k] || len(c.digest) != 64 {
			t.Fatalf("claim %v links %s (digest %q), want its first record %s", k, c.outboxID, c.digest, first[k])
		}
	}
	// A replay of the whole transaction is already ours, unit by unit.
	res, err = s.Enqueue(ctx, "r1", Fence{}, items, nil)
	if err != nil || res.Records != 0 || res.AlreadyOurs != len(items) || res.DigestMismatches != 0 {
		t.Fatalf("replay = %+v, %v; want all already ours", res, err)
	}
	// Another replica meets the same units as others' claims.
	res, err = s.Enqueue(ctx, "r2", Fence{}, items, nil)
	if err != nil || res.Records != 0 || res.OthersClaims != len(items) {
		t.Fatalf("other replica = %+v, %v; want all others' claims", res, err)
	}
	// A unit decoded differently is noticed.
	changed := slices.Clone(items[:2])
	for i := range changed {
		c := *changed[i].Change
		changed[i].Change = &c
		changed[i].Digest = strings.Repeat("f", 64)
	}
	res, err = s.Enqueue(ctx, "r1", Fence{}, changed, nil)
	if err != nil || res.DigestMismatches != 2 {
		t.Fatalf("changed unit = %+v, %v; want a digest mismatch per pipe", res, err)
	}
	if n := len(records(t, db, schema)); n != len(items) {
		t.Fatalf("%d records after replays, want %d", n, len(items))
	}
}

// A backfill chunk read twice over the same range is written once, even
// when its rows differ between the readings, and that is no digest
// mismatch.
func TestEnqueueBackfillChunkOnce(t *testing.T) {
	s, db, _ := testStore(t)
	schema := s.schema
	ctx := context.Background()
	unit := dedup.BackfillUnit("bf1", "", "k100")
	reading := func(rows int, name string) []Pending {
		var items []Pending
		for i := 0; i < rows; i++ {
			it := gtidItem("a:app.users:hook", 1, i)
			it.Change.Op = canonical.OpRead
			it.Change.After["name"] = name
			it.ChangeKey = dedup.BackfillKey("bf1", fmt.Sprintf("%064x", i))
			it.Digest = canonical.Digest(it.Pipe, it.Change.Op, it.Change.Key, it.Change.After, nil)
			it.Unit = unit
			items = append(items, it)
		}
		return items
	}
	if res, err := s.Enqueue(ctx, "r1", Fence{}, reading(50, "first"), nil); err != nil || res.Records != 50 {
		t.Fatalf("first reading = %+v, %v", res, err)
	}
	res, err := s.Enqueue(ctx, "r1", Fence{}, reading(48, "second"), nil)
	if err != nil || res.Records != 0 || res.AlreadyOurs != 48 || res.DigestMismatches != 0 {
		t.Fatalf("second reading = %+v, %v; want all already ours, no mismatch", res, err)
	}
	if n := len(claimsOf(t, db, schema)); n != 1 {
		t.Fatalf("%d claims, want 1 for the chunk", n)
	}
	if n := len(records(t, db, schema)); n != 50 {
		t.Fatalf("%d records, want the first reading's 50", n)
	}
}

// TestEnqueuePreparedBatch: the enqueue pipeline prepares batch 2 (ids
// drawn, segments encoded) while batch 1's transaction runs. If batch 1 is
// retried with new ids, batch 2 does not keep the ids it drew before them:
// every record of batch 1 sorts before every record of batch 2, as their
// commits do. A batch passed again after a failed attempt never reuses the
// ids of that attempt, and a prepared batch replayed over its own claims
// writes nothing new.
func TestEnqueuePreparedBatch(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	pipe := "a:app.users:hook"
	var one, two []Pending
	for i := 0; i < 20; i++ {
		one = append(one, gtidItem(pipe, 1, i))
		two = append(two, gtidItem(pipe, 2, i))
	}
	b1, err := s.PrepareBatch(one, nil)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := s.PrepareBatch(two, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b1.segs == nil || b2.segs == nil {
		t.Fatal("PrepareBatch encoded no segments")
	}
	prepared1 := b1.its[0].id
	// Batch 1's first attempt fails before it writes anything.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.EnqueueBatch(cancelled, "r1", Fence{}, b1); err == nil {
		t.Fatal("EnqueueBatch with a cancelled context succeeded")
	}
	// Its second attempt draws new ids, after batch 2's.
	if _, err := s.EnqueueBatch(ctx, "r1", Fence{}, b1); err != nil {
		t.Fatal(err)
	}
	if b1.its[0].id == prepared1 {
		t.Fatal("the second attempt reused the ids of the first")
	}
	if _, err := s.EnqueueBatch(ctx, "r1", Fence{}, b2); err != nil {
		t.Fatal(err)
	}
	recs := records(t, db, schema)
	if len(recs) != 40 {
		t.Fatalf("%d records, want 40", len(recs))
	}
	var last1, first2 string
	for _, r := range recs {
		switch gtid := strings.Split(r.ChangeKey, ":")[1]; {
		case strings.HasSuffix(gtid, "-1") && r.ID > last1:
			last1 = r.ID
		case strings.HasSuffix(gtid, "-2") && (first2 == "" || r.ID < first2):
			first2 = r.ID
		}
	}
	if last1 == "" || first2 == "" || last1 >= first2 {
		t.Fatalf("batch 1's last id %q, batch 2's first %q: want batch 1 before batch 2 (keys %q…)", last1, first2, recs[0].ChangeKey)
	}
	// A replay of batch 2, prepared again: every claim exists, so the
	// segments prepared for new claims are not written.
	b3, err := s.PrepareBatch(two, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.EnqueueBatch(ctx, "r1", Fence{}, b3)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 0 || res.AlreadyOurs != 20 {
		t.Fatalf("replayed prepared batch = %+v, want 0 inserted, 20 already ours", res)
	}
	if got := len(records(t, db, schema)); got != 40 {
		t.Fatalf("outbox records after the replay = %d, want 40", got)
	}
}

// Enqueue transactions begin on the pool WithReadCommitted gives (a state
// pool whose sessions are READ COMMITTED, state.Pool.ReadCommitted), and
// work there: new claims, and a batch sent again read back as already
// ours, with its checkpoint fenced by the lease.
func TestEnqueueOnReadCommittedPool(t *testing.T) {
	s, db, schema := testStore(t)
	pool, err := state.Open(mysqltest.Shared(t).DSN, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rc := s.WithReadCommitted(pool.ReadCommitted())
	ctx := context.Background()
	fence := grantLease(t, db, schema, "enqueue/a", "r1", 7, time.Hour)
	var items []Pending
	for i := 0; i < 5; i++ {
		items = append(items, gtidItem("a:app.users:hook", 9, i))
	}
	cp := &Checkpoint{Source: "enqueue/a", Pos: binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-9"}}
	res, err := rc.Enqueue(ctx, "r1", fence, items, cp)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != len(items) {
		t.Fatalf("result = %+v, want %d records", res, len(items))
	}
	if n := pool.ReadCommitted().Stats().OpenConnections; n == 0 {
		t.Fatal("the enqueue opened no connection of the READ COMMITTED pool")
	}
	res, err = rc.Enqueue(ctx, "r1", fence, items, cp)
	if err != nil {
		t.Fatal(err)
	}
	if res.Records != 0 || res.AlreadyOurs != len(items) {
		t.Fatalf("batch sent again: result = %+v, want all %d already ours", res, len(items))
	}
	if got := len(records(t, db, schema)); got != len(items) {
		t.Fatalf("%d records, want %d", got, len(items))
	}
	stale := Fence{Lease: fence.Lease, Holder: fence.Holder, Epoch: fence.Epoch - 1}
	if _, err := rc.Enqueue(ctx, "r1", stale, []Pending{gtidItem("a:app.users:hook", 10, 0)}, cp); !errors.Is(err, ErrFenced) {
		t.Fatalf("enqueue under a stale epoch: %v, want ErrFenced", err)
	}
}
