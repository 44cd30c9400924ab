package inspect

import (
	"context"
	"strconv"
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/internal/statetest"
)

// BenchmarkPipesRead measures one /v1/sinks read (Reader.Pipes) over an
// outbox of CDCOUT_BENCH_ROWS delivered rows (default 200,000) in 4 pipes
// plus 1% undelivered, and as many records again in done segments of 10
// (one pending segment per pipe) — the dashboard does this every two
// seconds.
func BenchmarkPipesRead(b *testing.B) {
	n := mysqltest.BenchEnv("CDCOUT_BENCH_ROWS", 200_000)
	srv := mysqltest.Shared(b)
	db, schema := statetest.New(b, "inspectbench")
	ctx := context.Background()
	srv.Exec(b, "INSERT INTO `"+schema+"`.outbox (id, pipe, sink, change_key, db, tbl, op, row_key, key_hash, status, attempts, last_error, last_error_at, commit_ts, created_at, next_attempt_at, payload) "+
		"SELECT LPAD(seq, 36, '0'), CONCAT('b:d.t', seq % 4, ':s'), 's', CONCAT('g:', seq), 'd', CONCAT('t', seq % 4), 'c', seq, SHA2(seq, 256), "+
		"IF(seq % 100 = 0, 'pending', 'delivered'), 1, IF(seq % 100 = 0, 'timeout', NULL), IF(seq % 100 = 0, NOW(6), NULL), "+
		"NOW(6) - INTERVAL seq SECOND, NOW(6) - INTERVAL seq SECOND, NOW(6), '{}' FROM "+mysqltest.Seq(n))
	// Segment ids sort after the rows' (digits): none of the rows left one.
	srv.Exec(b, "INSERT INTO `"+schema+"`.segments (id, pipe, sink, status, records, last_id, next_attempt_at, first_commit_ts, created_at, payload) "+
		"SELECT CONCAT('s', LPAD(seq, 35, '0')), CONCAT('b:d.t', seq % 4, ':s'), 's', IF(seq > "+strconv.Itoa(n/10)+", 'pending', 'done'), 10, "+
		"CONCAT('s', LPAD(seq, 35, '0')), NOW(6) - INTERVAL seq SECOND, NOW(6) - INTERVAL seq SECOND, NOW(6) - INTERVAL seq SECOND, REPEAT('x', 300) "+
		"FROM "+mysqltest.Seq(n/10+4))
	r := Reader{DB: db, Schema: schema, Instance: "b"}
	b.ResetTimer()
	for range b.N {
		pipes, err := r.Pipes(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(pipes) != 4 {
			b.Fatalf("pipes = %d", len(pipes))
		}
	}
}
