package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/dedup"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/statetest"
	"github.com/cdcout/cdcout/state"
)

func TestMain(m *testing.M) { mysqltest.RunMain(m) }

// testStore migrates a fresh state database and returns a Store over it.
func testStore(t testing.TB) (*Store, *sql.DB, string) {
	t.Helper()
	db, schema := statetest.New(t, "obx")
	return NewStore(db, schema, zaptest.NewLogger(t)), db, schema
}

// grantLease writes an enqueue lease row directly (the lease package is
// not under test here).
func grantLease(t testing.TB, db *sql.DB, schema, name, holder string, epoch uint64, ttl time.Duration) Fence {
	t.Helper()
	if _, err := db.Exec("REPLACE INTO "+state.Table(schema, "leases")+
		" (name, holder, epoch, expires_at, acquired_at, renewed_at) VALUES (?, ?, ?, NOW(6) + INTERVAL ? MICROSECOND, NOW(6), NOW(6))",
		name, holder, epoch, ttl.Microseconds()); err != nil {
		t.Fatal(err)
	}
	return Fence{Lease: name, Holder: holder, Epoch: epoch}
}

// gtidItem is row i of transaction 0-1-<txn> for pipe.
func gtidItem(pipe string, txn, i int) Pending {
	c := &canonical.Change{
		Op:     canonical.OpCreate,
		After:  canonical.Row{"id": int64(i), "name": fmt.Sprint("row ", i)},
		Key:    canonical.Row{"id": int64(i)},
		Source: canonical.Source{Connector: "cdcout", DB: "app", Table: "users", GTID: fmt.Sprint("0-1-", txn), Row: i, TsMs: 1_700_000_000_123},
		TsMs:   1_700_000_000_456,
	}
	return Pending{
		Pipe: pipe, Sink: sinkOf(pipe), Change: c,
		ChangeKey: dedup.GTIDKey(c.Source.GTID, i),
		Digest:    canonical.Digest(pipe, c.Op, c.Key, c.After, c.Before),
	}
}

func sinkOf(pipe string) string { return PipeSink(pipe) }

func count(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func TestCheckpointLoadAndReset(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	if pos, err := s.LoadCheckpoint(ctx, "enqueue/a"); err != nil || pos != nil {
		t.Fatalf("LoadCheckpoint on empty = %v, %v; want nil, nil", pos, err)
	}
	fence := grantLease(t, db, schema, "enqueue/a", "r1", 3, time.Hour)
	want := binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-42", File: "bin.000002", Pos: 1234}
	if _, err := s.Enqueue(ctx, "r1", fence, nil, &Checkpoint{Source: "enqueue/a", Pos: want}); err != nil {
		t.Fatal(err)
	}
	pos, err := s.LoadCheckpoint(ctx, "enqueue/a")
	if err != nil || pos == nil || *pos != want {
		t.Fatalf("LoadCheckpoint = %+v, %v; want %+v", pos, err, want)
	}
	var epoch uint64
	var holder string
	if err := db.QueryRow("SELECT epoch, holder FROM "+state.Table(schema, "checkpoints")+" WHERE source = 'enqueue/a'").Scan(&epoch, &holder); err != nil {
		t.Fatal(err)
	}
	if epoch != 3 || holder != "r1" {
		t.Fatalf("checkpoint written by epoch %d holder %q, want 3 r1", epoch, holder)
	}
	// Other sources are independent.
	if pos, err := s.LoadCheckpoint(ctx, "enqueue/b"); err != nil || pos != nil {
		t.Fatalf("other source = %v, %v", pos, err)
	}
	if err := s.ResetCheckpoint(ctx, "enqueue/a"); err != nil {
		t.Fatal(err)
	}
	if pos, err := s.LoadCheckpoint(ctx, "enqueue/a"); err != nil || pos != nil {
		t.Fatalf("after reset = %v, %v; want nil", pos, err)
	}
}

func TestLoadCheckpointAndClaims(t *testing.T) {
	s, db, schema := testStore(t)
	ctx := context.Background()
	fence := grantLease(t, db, schema, "enqueue/a", "r1", 1, time.Hour)
	pipe := "a:app.users:hook"

	// Digest-mode items, a GTID-mode item, and an old digest claim.
	var items []Pending
	var wantKeys []string
	for i := 0; i < 5; i++ {
		p := gtidItem(pipe, 9, i)
		p.ChangeKey = dedup.DigestKey(p.Digest, 0)
		items = append(items, p)
		wantKeys = append(wantKeys, p.ChangeKey)
	}
	items = append(items, gtidItem(pipe, 10, 0))
	old := gtidItem(pipe, 8, 0)
	old.ChangeKey = dedup.DigestKey(strings.Repeat("0", 64), 3)
	items = append(items, old)
	cpPos := binlog.Position{Flavor: "mariadb", GTIDSet: "0-1-10"}
	if _, err := s.Enqueue(ctx, "r1", fence, items, &Checkpoint{Source: "enqueue/a", Pos: cpPos}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE "+state.Table(schema, "claims")+" SET created_at = NOW(6) - INTERVAL 1 HOUR WHERE change_key = ?", old.ChangeKey); err != nil {
		t.Fatal(err)
	}

	pos, keys, err := s.LoadCheckpointAndClaims(ctx, "enqueue/a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if pos == nil || *pos != cpPos {
		t.Fatalf("position = %+v, want %+v", pos, cpPos)
	}
	got := map[string]bool{}
	for _, k := range keys {
		got[k] = true
	}
	if len(keys) != len(wantKeys) {
		t.Fatalf("keys = %v, want %v", keys, wantKeys)
	}
	for _, k := range wantKeys {
		if !got[k] {
			t.Fatalf("key %s missing from %v", k, keys)
		}
	}
	// Seeding a counter from them continues each digest after the claim.
	c := dedup.NewOccurrenceCounter(2*time.Minute, 100)
	c.SeedFromChangeKeys(keys, time.Now())
	if n := c.Next(items[0].Digest, time.Now()); n != 1 {
		t.Fatalf("occurrence after seeding = %d, want 1", n)
	}

	// A claim written after the checkpoint (a huge transaction's rows,
	// enqueued before its commit) is not seeded: a replay from the
	// checkpoint must key those rows as they were keyed the first time.
	late := gtidItem(pipe, 11, 0)
	late.ChangeKey = dedup.DigestKey(strings.Repeat("1", 64), 0)
	if _, err := s.Enqueue(ctx, "r1", fence, []Pending{late}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("UPDATE "+state.Table(schema, "claims")+" SET created_at = NOW(6) + INTERVAL 1 SECOND WHERE change_key = ?", late.ChangeKey); err != nil {
		t.Fatal(err)
	}
	if _, keys, err = s.LoadCheckpointAndClaims(ctx, "enqueue/a", time.Minute); err != nil || len(keys) != len(wantKeys) {
		t.Fatalf("with a claim after the checkpoint: %d keys (%v), want %d", len(keys), err, len(wantKeys))
	}

	// No checkpoint: nothing was enqueued that a replay could meet.
	pos, keys, err = s.LoadCheckpointAndClaims(ctx, "enqueue/none", time.Minute)
	if err != nil || pos != nil || len(keys) != 0 {
		t.Fatalf("no checkpoint: %v, %d keys, %v", pos, len(keys), err)
	}
}

func TestStoreRaiseIDFloor(t *testing.T) {
	s, db, schema := testStore(t)
	defer resetIDs()
	ctx := context.Background()
	if err := s.RaiseIDFloor(ctx); err != nil { // empty outbox: no-op
		t.Fatal(err)
	}
	ahead := "fffff000-0000-7000-8000-000000000000"
	if _, err := db.Exec("INSERT INTO "+state.Table(schema, "outbox")+
		" (id, pipe, sink, change_key, db, tbl, op, row_key, key_hash, commit_ts, payload) VALUES (?, 'p', 's', 'g:x:0', 'd', 't', 'c', 'null', '', NOW(6), '{}')", ahead); err != nil {
		t.Fatal(err)
	}
	if err := s.RaiseIDFloor(ctx); err != nil {
		t.Fatal(err)
	}
	if id := NewID(); id <= ahead {
		t.Fatalf("NewID = %s, not after the outbox's newest id %s", id, ahead)
	}
}
