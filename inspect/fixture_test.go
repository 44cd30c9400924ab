package inspect

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/statetest"
)

func TestMain(m *testing.M) { mysqltest.RunMain(m) }

// The dead row's error, asserted in the rendered dashboard.
const deadError = "webhook answered 410 Gone: endpoint retired"

// fixture creates a migrated state database holding, for instance "inst":
// pipe inst:shop.orders:hook with 3 pending, 2 delivered, 1 dead row and a
// retrying row's error, a done segment of 5 records one of which left it as
// a (since delivered) row, and a pending segment of 3 records enqueued 40 s
// ago (before any pending row): 6 pending, 7 delivered, 1 dead record; pipe
// inst:shop.users:hook with 1 delivered row; pipe inst:shop.carts:hook with
// only a done segment of 2 records; a row and a pending segment of another
// instance; enqueue/drain leases; a checkpoint; fleet rows.
func fixture(t *testing.T) (*sql.DB, string) {
	t.Helper()
	srv := mysqltest.Shared(t)
	db, schema := statetest.New(t, "inspect")
	ctx := context.Background()
	n := 0
	row := func(pipe, status, lastErr string, ageSec int) string {
		n++
		return fixtureRow(n, pipe, status, lastErr, ageSec)
	}
	insert := "INSERT INTO `" + schema + "`.outbox (id, pipe, sink, change_key, db, tbl, op, row_key, key_hash, status, attempts, last_error, last_error_at, commit_ts, created_at, next_attempt_at, payload) VALUES "
	srv.Exec(t, insert+row("inst:shop.orders:hook", "pending", "", 30)+","+
		row("inst:shop.orders:hook", "pending", "connection refused", 20)+","+
		row("inst:shop.orders:hook", "pending", "", 5)+","+
		row("inst:shop.orders:hook", "delivered", "", 60)+","+
		row("inst:shop.orders:hook", "delivered", "", 50)+","+
		row("inst:shop.orders:hook", "dead", deadError, 90)+","+
		row("inst:shop.users:hook", "delivered", "", 40)+","+
		row("other:shop.orders:hook", "dead", "other instance error", 10)+","+
		// The third record of segment 101–105 below, delivered on a retry.
		fixtureRow(103, "inst:shop.orders:hook", "delivered", "", 45))
	srv.Exec(t, "INSERT INTO `"+schema+"`.segments (id, pipe, sink, status, records, last_id, next_attempt_at, first_commit_ts, created_at, payload) VALUES "+
		fixtureSegment(101, 105, "inst:shop.orders:hook", "done", 45)+","+
		fixtureSegment(201, 203, "inst:shop.orders:hook", "pending", 40)+","+
		fixtureSegment(301, 302, "inst:shop.carts:hook", "done", 80)+","+
		fixtureSegment(401, 409, "other:shop.orders:hook", "pending", 500))
	srv.Exec(t, "INSERT INTO `"+schema+"`.leases (name, holder, epoch, expires_at, acquired_at, renewed_at) VALUES "+
		"('enqueue/inst', 'replica-a/n1', 3, NOW(6) + INTERVAL 10 SECOND, NOW(6), NOW(6)),"+
		"('drain/inst:shop.orders:hook', 'replica-b/n2', 7, NOW(6) + INTERVAL 10 SECOND, NOW(6), NOW(6)),"+
		"('enqueue/other', 'replica-x/n9', 1, NOW(6) + INTERVAL 10 SECOND, NOW(6), NOW(6))",
		"INSERT INTO `"+schema+"`.checkpoints (source, position, epoch, holder, updated_at) VALUES "+
			"('enqueue/inst', '{\"flavor\":\"mariadb\",\"gtid_set\":\"0-1-42\"}', 3, 'replica-a/n1', NOW(6))")
	for _, o := range []fleet.Observation{
		{ReplicaID: "replica-a", Kind: fleet.KindEngine, Version: "v1.2.0", Payload: EngineInfo{Instance: "inst", Role: "leader"}},
		{ReplicaID: "replica-c", Kind: fleet.KindEngine, Version: "v1.1.0", Payload: EngineInfo{Instance: "inst", Role: "standby"}},
		{ReplicaID: "replica-x", Kind: fleet.KindEngine, Version: "v0.9.0", Payload: EngineInfo{Instance: "other"}},
	} {
		if err := fleet.Write(ctx, db, schema, o); err != nil {
			t.Fatal(err)
		}
	}
	srv.Exec(t, "UPDATE `"+schema+"`.replicas SET written_at = NOW(6) - INTERVAL 200 SECOND WHERE replica_id = 'replica-c'")
	return db, schema
}

// fixtureID is the fixture's record id number n.
func fixtureID(n int) string { return fmt.Sprintf("0190a000-0000-7000-8000-%012d", n) }

// fixtureRow is the VALUES tuple of outbox row n, enqueued ageSec ago.
func fixtureRow(n int, pipe, status, lastErr string, ageSec int) string {
	errCol, errAt := "NULL", "NULL"
	if lastErr != "" {
		errCol, errAt = "'"+lastErr+"'", fmt.Sprintf("NOW(6) - INTERVAL %d SECOND", ageSec/10)
	}
	return fmt.Sprintf("('%s', '%s', 'hook', 'g:%d', 'shop', 'orders', 'c', '{\"id\":%d}', "+
		"SHA2('%d', 256), '%s', %d, %s, %s, NOW(6) - INTERVAL %d SECOND, NOW(6) - INTERVAL %d SECOND, NOW(6), '{}')",
		fixtureID(n), pipe, n, n, n, status, map[bool]int{true: 10, false: 1}[status == "dead"], errCol, errAt, ageSec+2, ageSec)
}

// fixtureSegment is the VALUES tuple of an unclaimed segment holding
// records first…last, enqueued ageSec ago (committed 2 s before); a done
// one was done 5 s after. Readers of counts never parse the payload.
func fixtureSegment(first, last int, pipe, status string, ageSec int) string {
	next := "NOW(6)"
	if status == "done" {
		next = fmt.Sprintf("NOW(6) - INTERVAL %d SECOND", ageSec-5)
	}
	return fmt.Sprintf("('%s', '%s', 'hook', '%s', %d, '%s', %s, NOW(6) - INTERVAL %d SECOND, NOW(6) - INTERVAL %d SECOND, 'x')",
		fixtureID(first), pipe, status, last-first+1, fixtureID(last), next, ageSec+2, ageSec)
}
