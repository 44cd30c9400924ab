// Package sinkbench holds the benchmark harness the broker sinks share:
// envelope-sized records, concurrent Deliver calls as the drainer makes
// them, and a full drain of enqueued outbox rows from a real MariaDB
// through outbox.Drainer into a sink. Each sink's benchmark only sets up
// its broker and checks what the broker stored.
package sinkbench

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/gctune"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/state"
)

// Rows is CDCOUT_BENCH_ROWS, or 200,000.
func Rows(b *testing.B) int {
	if v := os.Getenv("CDCOUT_BENCH_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("CDCOUT_BENCH_ROWS=%q", v)
		}
		return n
	}
	return 200_000
}

// Records builds n records of the pipe "bench:shop.items:<sinkName>" with
// distinct keys and envelope-sized payloads (~450 bytes).
func Records(n int, sinkName string) []outbox.Record {
	recs := make([]outbox.Record, n)
	for i := range recs {
		id := fmt.Sprintf("0192f3a0-0000-7000-8000-%012d", i)
		recs[i] = outbox.Record{
			ID: id, Pipe: "bench:shop.items:" + sinkName, Sink: sinkName, DB: "shop", Table: "items",
			Op: canonical.OpUpdate, Key: fmt.Sprintf(`{"id":%d}`, i), Attempt: 1,
			CommitTime: time.Unix(1764420000, 0),
			Payload: fmt.Appendf(nil, `{"after":{"id":%d,"name":"item %d","price":"12.50","qty":3},`+
				`"before":{"id":%d,"name":"item %d","price":"9.90","qty":3},"change_key":"g:0-1-%d:0",`+
				`"id":%q,"key":{"id":%d},"op":"u","source":{"connector":"cdcout","db":"shop","file":"mysql-bin.000003",`+
				`"gtid":"0-1-%d","instance":"bench","pos":1234,"row":0,"server_id":1,"table":"items","ts_ms":1764420000000,`+
				`"version":"dev"},"ts_ms":1764420000123}`, i, i, i, i, i, id, i, i),
		}
	}
	return recs
}

// Measure delivers recs through s once per benchmark iteration (batches of
// 250, 8 concurrent calls: the sink defaults' concurrency) and reports
// records/s; the timer is stopped when it returns.
func Measure(b *testing.B, s outbox.Sink, recs []outbox.Record) {
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		deliverAll(b, s, recs, 250, 8)
	}
	b.ReportMetric(float64(len(recs)*b.N)/time.Since(start).Seconds(), "records/s")
	b.StopTimer()
}

// deliverAll pushes recs through s in batches from conc goroutines, as the
// drainer does, and fails on any error.
func deliverAll(b *testing.B, s outbox.Sink, recs []outbox.Record, batch, conc int) {
	var wg sync.WaitGroup
	next := make(chan []outbox.Record)
	for range conc {
		wg.Go(func() {
			for call := range next {
				for i, err := range s.Deliver(context.Background(), call) {
					if err != nil {
						b.Errorf("record %s: %v", call[i].ID, err)
						return
					}
				}
			}
		})
	}
	for i := 0; i < len(recs); i += batch {
		next <- recs[i:min(i+batch, len(recs))]
	}
	close(next)
	wg.Wait()
}

// Drain measures the end-to-end drain rate: Rows(b) pending outbox rows
// (over rows/4 keys, so per-key order is in play) enqueued through
// outbox.Store.Enqueue into a throwaway MariaDB, then claimed by
// outbox.Drainer and delivered through s with batches of 500 and 8
// concurrent calls. Enqueueing is not timed. It reports "rows/s" and
// "sink-share", the fraction of the drain's wall time some Deliver call was
// running (a low share means the drainer's database work bounds the rate),
// and returns how many rows were delivered in all.
func Drain(b *testing.B, s outbox.Sink, sinkName string) int {
	rows := Rows(b)
	gctune.Apply() // as the cdcout binary runs
	srv := mysqltest.Start(b, mysqltest.Options{})
	pipe := "bench:shop.items:" + sinkName
	busy := &busySink{s: s}
	var total, dbCPU, ownCPU time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		// The state pool the engine uses (state.Open): among other things
		// its sessions binlog MINIMAL row images, so the drainer's updates
		// do not log the payload twice.
		pool, err := state.Open(srv.DSN, 0)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { pool.Close() })
		db := pool.DB
		schema := srv.CreateDB(b, "drain")
		if err := state.Migrate(context.Background(), db, schema); err != nil {
			b.Fatal(err)
		}
		enqueue(b, outbox.NewStore(db, schema, zap.NewNop()), pipe, sinkName, rows)
		analyzeIfAsked(b, db, schema)
		var delivered atomic.Int64
		d, err := outbox.NewDrainer(outbox.DrainerConfig{
			DB: db, Schema: schema, ClaimedBy: fmt.Sprintf("bench/%d", i),
			Pipes:   map[string]outbox.PipeConfig{pipe: {Sink: busy, BatchSize: 500, Concurrency: 8}},
			Metrics: outbox.DrainMetrics{Delivered: func(_ string, n int) { delivered.Add(int64(n)) }},
		})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		db0, _ := srv.CPUTime()
		own0 := mysqltest.OwnCPUTime()
		go func() { done <- d.Run(ctx) }()
		waitDelivered(b, &delivered, rows)
		total += time.Since(start)
		db1, _ := srv.CPUTime()
		dbCPU += db1 - db0
		ownCPU += mysqltest.OwnCPUTime() - own0
		b.StopTimer()
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*b.N)/total.Seconds(), "rows/s")
	b.ReportMetric(busy.busy().Seconds()/total.Seconds(), "sink-share")
	// CPU per row, which unlike rows/s does not depend on what else runs
	// on the machine: the database's, and this process's (drainer, sink
	// and the embedded broker).
	b.ReportMetric(float64(dbCPU.Microseconds())/float64(rows*b.N), "db_cpu_us/row")
	b.ReportMetric(float64(ownCPU.Microseconds())/float64(rows*b.N), "proc_cpu_us/row")
	return rows * b.N
}

func waitDelivered(b *testing.B, delivered *atomic.Int64, rows int) {
	deadline := time.Now().Add(30 * time.Minute)
	for delivered.Load() < int64(rows) {
		if time.Now().After(deadline) {
			b.Fatalf("drained %d of %d rows in 30 minutes", delivered.Load(), rows)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// analyzeIfAsked refreshes the index statistics of the outbox's tables
// (segments, where enqueue writes, and rows) when CDCOUT_BENCH_ANALYZE=1,
// to compare the drain rate with fresh statistics against the rate right
// after a bulk enqueue (stale ones).
func analyzeIfAsked(b *testing.B, db *sql.DB, schema string) {
	if os.Getenv("CDCOUT_BENCH_ANALYZE") != "1" {
		return
	}
	if err := outbox.NewStore(db, schema, nil).Analyze(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// busySink measures the wall time during which at least one Deliver call
// is running.
type busySink struct {
	s       outbox.Sink
	running atomic.Int64
	since   atomic.Int64 // unix ns when running went 0 → 1
	total   atomic.Int64
}

func (t *busySink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	if t.running.Add(1) == 1 {
		t.since.Store(time.Now().UnixNano())
	}
	defer func() {
		if t.running.Add(-1) == 0 {
			t.total.Add(time.Now().UnixNano() - t.since.Load())
		}
	}()
	return t.s.Deliver(ctx, recs)
}

func (t *busySink) busy() time.Duration { return time.Duration(t.total.Load()) }

// enqueue writes rows pending inserts for pipe through the outbox's own
// Enqueue, over rows/4 keys.
func enqueue(b *testing.B, st *outbox.Store, pipe, sinkName string, rows int) {
	b.Helper()
	const chunk = 5000
	for start := 0; start < rows; start += chunk {
		items := make([]outbox.Pending, 0, chunk)
		for j := start; j < min(start+chunk, rows); j++ {
			key := canonical.Row{"id": int64(j % max(rows/4, 1))}
			after := canonical.Row{"id": key["id"], "name": fmt.Sprintf("item %d", j), "price": "12.50", "qty": int64(3)}
			ch := &canonical.Change{
				Op: canonical.OpCreate, After: after, Key: key, TsMs: 1764420000123,
				Source: canonical.Source{Connector: "cdcout", Version: "dev", Instance: "bench", DB: "shop", Table: "items",
					ServerID: 1, GTID: fmt.Sprintf("0-1-%d", j+1), File: "mysql-bin.000003", Pos: 1234, TsMs: 1764420000000},
			}
			items = append(items, outbox.Pending{
				Pipe: pipe, Sink: sinkName, Change: ch,
				ChangeKey: fmt.Sprintf("g:0-1-%d:0", j+1),
				Digest:    canonical.Digest(pipe, ch.Op, key, after, nil),
			})
		}
		if _, err := st.Enqueue(context.Background(), "bench", outbox.Fence{}, items, nil); err != nil {
			b.Fatal(err)
		}
	}
}
