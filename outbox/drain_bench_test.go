package outbox

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/state"
)

// BenchmarkDrain measures rows/s drained from the outbox to a no-op sink
// with the default concurrency and batch size (CDCOUT_BENCH_CONCURRENCY and
// CDCOUT_BENCH_BATCH override them): CDCOUT_BENCH_ROWS rows
// (default 20,000) over CDCOUT_BENCH_KEYS keys (default a quarter as many),
// so per-key order is in play. The figure is dominated by the claim/outcome statements against
// the database.
func BenchmarkDrain(b *testing.B) {
	rows := 20000
	if v := os.Getenv("CDCOUT_BENCH_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("CDCOUT_BENCH_ROWS=%q", v)
		}
		rows = n
	}
	keys := max(rows/4, 1)
	if v := os.Getenv("CDCOUT_BENCH_KEYS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("CDCOUT_BENCH_KEYS=%q", v)
		}
		keys = n
	}
	pc := PipeConfig{Sink: okSink(), Concurrency: benchEnvInt(b, "CDCOUT_BENCH_CONCURRENCY"), BatchSize: benchEnvInt(b, "CDCOUT_BENCH_BATCH")}
	s := newTestState(b)
	srv := mysqltest.Shared(b)
	const pipe = "bench:app.t:noop"
	tbl := state.Table(s.schema, "outbox")
	var total, dbCPU time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s.exec(b, `DELETE FROM {outbox}`)
		for start := 0; start < rows; start += 1000 {
			var (
				vals []string
				args []any
			)
			for j := start; j < min(start+1000, rows); j++ {
				id := nextTestID()
				key := fmt.Sprintf("[%d]", j%keys)
				vals = append(vals, "(?, ?, 'noop', ?, 'app', 't', 'u', ?, ?, NOW(6), ?)")
				args = append(args, id, pipe, "g:"+id, key, keyHash(key), `{"id":"`+id+`","after":{"a":1,"b":"some text"}}`)
			}
			if _, err := s.db.Exec(`INSERT INTO `+tbl+` (id, pipe, sink, change_key, db, tbl, op, row_key, key_hash, commit_ts, payload) VALUES `+
				strings.Join(vals, ","), args...); err != nil {
				b.Fatal(err)
			}
		}
		// The engine's state pool (MINIMAL row images), and the drainer's
		// own count of deliveries rather than COUNT(*) polls, which would
		// cost the database as much as a share of the drain.
		pool, err := state.Open(srv.DSN, 0)
		if err != nil {
			b.Fatal(err)
		}
		var delivered atomic.Int64
		d := s.drainer(b, "bench/1", map[string]PipeConfig{pipe: pc}, func(c *DrainerConfig) {
			c.DB = pool.DB
			c.Metrics.Delivered = func(_ string, n int) { delivered.Add(int64(n)) }
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		db0, _ := srv.CPUTime()
		go func() { done <- d.Run(ctx) }()
		for delivered.Load() < int64(rows) {
			time.Sleep(5 * time.Millisecond)
		}
		total += time.Since(start)
		db1, _ := srv.CPUTime()
		dbCPU += db1 - db0
		b.StopTimer()
		cancel()
		err = <-done
		pool.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*b.N)/total.Seconds(), "rows/s")
	// The database's CPU per row (0 against CDCOUT_TEST_DSN): unlike rows/s
	// it does not depend on what else runs on the machine.
	b.ReportMetric(float64(dbCPU.Microseconds())/float64(rows*b.N), "db_cpu_us/row")
}

// benchEnvInt is a positive integer from the environment, or 0 (the
// default) when unset.
func benchEnvInt(b *testing.B, name string) int {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
