package fleet

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/statetest"
	"github.com/cdcout/cdcout/internal/wait"
)

func TestMain(m *testing.M) { mysqltest.RunMain(m) }

func TestWriteReadForgetMembers(t *testing.T) {
	srv := mysqltest.Shared(t)
	db, schema := statetest.New(t, "fleet")
	ctx := context.Background()
	start := time.Date(2026, 3, 1, 10, 0, 0, 123000, time.UTC)
	for _, o := range []Observation{
		{ReplicaID: "r1", Kind: KindEngine, StartedAt: start, Version: "v1", Payload: payload{Pipes: 3}, ReachableAt: "10.0.0.1:8080"},
		{ReplicaID: "r2", Kind: KindEngine, StartedAt: start, Version: "v1", Payload: payload{Pipes: 1}},
	} {
		if err := Write(ctx, db, schema, o); err != nil {
			t.Fatal(err)
		}
	}
	// A restart overwrites its own row.
	if err := Write(ctx, db, schema, Observation{ReplicaID: "r1", Kind: KindEngine, StartedAt: start.Add(time.Hour), Version: "v2", Payload: payload{Pipes: 4}}); err != nil {
		t.Fatal(err)
	}
	// r2 has not written for five minutes.
	srv.Exec(t, "UPDATE `"+schema+"`.replicas SET written_at = NOW(6) - INTERVAL 5 MINUTE WHERE replica_id = 'r2'")
	// r3 holds a live lease of this instance but writes no row; r4 holds
	// one of another instance; r5 an expired one.
	srv.Exec(t, "INSERT INTO `"+schema+"`.leases (name, holder, epoch, expires_at) VALUES "+
		"('enqueue/inst', 'r3/abc', 1, NOW(6) + INTERVAL 1 MINUTE),"+
		"('drain/other:db.t:s', 'r4/abc', 1, NOW(6) + INTERVAL 1 MINUTE),"+
		"('drain/inst:db.t:s', 'r5/abc', 1, NOW(6) - INTERVAL 1 MINUTE)")

	rows, err := Read(ctx, db, schema, KindEngine)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rows), 2; got != want {
		t.Fatalf("rows = %d, want %d", got, want)
	}
	if got, want := rows[0].Version, "v2"; got != want {
		t.Fatalf("r1 version = %q, want %q (restart overwrites)", got, want)
	}
	if got, want := rows[0].StartedAt, start.Add(time.Hour); !got.Equal(want) {
		t.Fatalf("r1 started_at = %v, want %v", got, want)
	}
	if got, want := rows[0].ReachableAt, ""; got != want {
		t.Fatalf("r1 reachable_at = %q, want %q", got, want)
	}
	if rows[0].Age > 10*time.Second || rows[1].Age < 5*time.Minute-time.Second {
		t.Fatalf("ages = %v, %v", rows[0].Age, rows[1].Age)
	}

	mem, err := Members(ctx, db, schema, "inst", rows, 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, m := range mem {
		ids[m.ID] = true
	}
	if !ids["r1"] || !ids["r2"] || !ids["r3"] || ids["r4"] || ids["r5"] || len(ids) != 3 {
		t.Fatalf("members = %v, want r1, r2, r3", mem)
	}
	res := Merge[payload](rows, mem, DefaultStaleAfter)
	if len(res.Missing) != 1 || res.Missing[0] != "r3" {
		t.Fatalf("missing = %v, want [r3]", res.Missing)
	}
	if len(res.Stale) != 1 || res.Stale[0].ReplicaID != "r2" || res.Stale[0].AgeSeconds < 299 {
		t.Fatalf("stale = %v, want r2 ~300s", res.Stale)
	}
	if res.Responded != 1 || res.Expected != 3 {
		t.Fatalf("responded/expected = %d/%d, want 1/3", res.Responded, res.Expected)
	}
	if res.Versions["v1"] != 1 || res.Versions["v2"] != 1 {
		t.Fatalf("versions = %v, want v1:1 v2:1", res.Versions)
	}

	n, err := Forget(ctx, db, schema, "r2")
	if err != nil || n != 1 {
		t.Fatalf("forget = %d, %v; want 1 row", n, err)
	}
	rows, err = Read(ctx, db, schema, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ReplicaID != "r1" {
		t.Fatalf("rows after forget = %+v", rows)
	}
}

func TestHeartbeatWrites(t *testing.T) {
	db, schema := statetest.New(t, "fleethb")
	n := 0
	hb := &Heartbeat{DB: db, Schema: schema, Every: 20 * time.Millisecond, Observe: func() Observation {
		n++
		return Observation{ReplicaID: "hb", Kind: KindEngine, Version: "v", Payload: payload{Pipes: n}}
	}}
	stop := wait.Background(t, 10*time.Second, hb.Run)
	// Written at least twice.
	waitPayload(t, db, schema, "heartbeat rewrites its row", func(p string) bool { return p != `{"pipes":1}` })
	stop()
}

// waitPayload waits until schema holds one engine observation, with a
// payload ok accepts.
func waitPayload(t *testing.T, db *sql.DB, schema, what string, ok func(payload string) bool) {
	t.Helper()
	wait.For(t, 10*time.Second, func() (bool, string) {
		rows, err := Read(context.Background(), db, schema, KindEngine)
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) == 1 && ok(string(rows[0].Payload)), fmt.Sprintf("waiting until %s: %+v", what, rows)
	})
}

// A role change must show in the fleet view at once, not a period later.
func TestHeartbeatWritesOnChange(t *testing.T) {
	db, schema := statetest.New(t, "fleethbc")
	changed := make(chan struct{}, 1)
	var mu sync.Mutex
	role := 1
	hb := &Heartbeat{DB: db, Schema: schema, Every: time.Hour, Changed: changed, Observe: func() Observation {
		mu.Lock()
		defer mu.Unlock()
		return Observation{ReplicaID: "hbc", Kind: KindEngine, Version: "v", Payload: payload{Pipes: role}}
	}}
	stop := wait.Background(t, 10*time.Second, hb.Run)
	is := func(want string) func(string) bool { return func(p string) bool { return p == want } }
	waitPayload(t, db, schema, `the payload is {"pipes":1}`, is(`{"pipes":1}`))
	mu.Lock()
	role = 2
	mu.Unlock()
	changed <- struct{}{}
	// With Every = 1h only the signal can have written it.
	waitPayload(t, db, schema, `the payload is {"pipes":2}`, is(`{"pipes":2}`))
	stop()
}
