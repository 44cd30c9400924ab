package outbox

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/state"
)

// BenchmarkDrain measures rows/s drained from the outbox to a no-op sink
// with the default concurrency and batch size: CDCOUT_BENCH_ROWS rows
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
	s := newTestState(b)
	const pipe = "bench:app.t:noop"
	tbl := state.Table(s.schema, "outbox")
	var total time.Duration
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
		d := s.drainer(b, "bench/1", map[string]PipeConfig{pipe: {Sink: okSink()}}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { done <- d.Run(ctx) }()
		for s.count(b, `SELECT COUNT(*) FROM {outbox} WHERE status = 'delivered'`) < rows {
			time.Sleep(20 * time.Millisecond)
		}
		total += time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*b.N)/total.Seconds(), "rows/s")
}
