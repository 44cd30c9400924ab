package backfill_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/engine"
	"github.com/cdcout/cdcout/internal/gctune"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/state"
)

// BenchmarkBackfill measures the backfill's enqueue rate (rows read,
// bracketed by watermarks, applied by the engine and committed to the
// outbox) on a table of CDCOUT_BENCH_ROWS rows (default 1,000,000), beside
// the database's own rate for a plain full SELECT of the same table.
// CDCOUT_BENCH_CHUNK sets the chunk size (default 1000). The engine
// delivers to stdout meanwhile, as a backfill's engine does; with
// CDCOUT_BENCH_DRAIN=0 the sink holds its first requests until the end, so
// the rate is the enqueue path's alone. CDCOUT_BENCH_READ_ONLY=1 measures
// a read-only backfill (fenced by binlog positions).
func BenchmarkBackfill(b *testing.B) {
	gctune.Apply() // the collector as the cdcout binary runs it
	n := mysqltest.BenchEnv("CDCOUT_BENCH_ROWS", 1_000_000)
	chunk := mysqltest.BenchEnv("CDCOUT_BENCH_CHUNK", backfill.DefaultChunkSize)
	sink := config.Sink{Name: "out", URL: "stdout:"}
	releaseHeld := func() {}
	if os.Getenv("CDCOUT_BENCH_DRAIN") == "0" {
		release := make(chan struct{})
		held := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		b.Cleanup(held.Close)
		var once sync.Once
		releaseHeld = func() { once.Do(func() { close(release) }) }
		b.Cleanup(releaseHeld)
		sink = config.Sink{Name: "out", URL: held.URL, Timeout: 4 * time.Minute}
	}
	srv := mysqltest.Shared(b)
	src := srv.CreateDB(b, "bfb_src")
	table := "`" + src + "`.t"
	srv.Exec(b, "CREATE TABLE "+table+" (id INT PRIMARY KEY, v BIGINT NOT NULL, s VARCHAR(40) NOT NULL, ts DATETIME(3) NOT NULL)",
		fmt.Sprintf("INSERT INTO %s SELECT seq, seq * 7, CONCAT('row-', seq), '2026-01-02 03:04:05.678' FROM %s", table, mysqltest.Seq(n)),
		"ANALYZE TABLE "+table)
	db := srv.Open(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// The database's own rate: every row of a plain SELECT, scanned.
		t0 := time.Now()
		rows, err := db.Query("SELECT id, v, s, ts FROM " + table)
		if err != nil {
			b.Fatal(err)
		}
		var id, v int64
		var s, ts sql.RawBytes
		got := 0
		for rows.Next() {
			if err := rows.Scan(&id, &v, &s, &ts); err != nil {
				b.Fatal(err)
			}
			got++
		}
		rows.Close()
		selectRate := float64(got) / time.Since(t0).Seconds()

		stateDB := srv.CreateDB(b, "bfb_state")
		dropWatermarkDB(b, srv, stateDB)
		if err := state.Migrate(context.Background(), db, stateDB); err != nil {
			b.Fatal(err)
		}
		cfg := engineConfig(b, srv, stateDB, gtidPos(b, db), "bench", []config.Sink{sink})
		e, err := engine.New(cfg, zap.NewNop(), engine.WithStdout(io.Discard))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		r := &backfill.Runner{Source: db, State: db, StateSchema: stateDB, Stall: time.Minute}
		if _, err := r.Prepare(context.Background(), backfill.Spec{Table: src + ".t", Sinks: []string{"out"}, ChunkSize: chunk, Instance: "bench",
			ReadOnly: os.Getenv("CDCOUT_BENCH_READ_ONLY") == "1"}); err != nil {
			b.Fatal(err)
		}
		db0, _ := srv.CPUTime()
		own0 := mysqltest.OwnCPUTime()
		t1 := time.Now()
		if err := r.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
		took := time.Since(t1)
		db1, dbOK := srv.CPUTime()
		own := mysqltest.OwnCPUTime() - own0
		st := e.Stats()
		b.Logf("engine: %d rows in %d batches, %s in enqueue transactions", st.RecordsWritten, st.Batches, st.EnqueueTime.Round(time.Millisecond))
		releaseHeld()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		if enq := countOp(b, db, stateDB, "r"); enq != n {
			b.Fatalf("%d rows enqueued, want %d", enq, n)
		}
		rate := float64(n) / took.Seconds()
		b.ReportMetric(rate, "rows/s")
		b.ReportMetric(selectRate, "select-rows/s")
		// CPU per row does not move with other load the way rates do.
		b.ReportMetric(float64(own.Microseconds())/float64(n), "process_cpu_us/row")
		if dbOK {
			b.ReportMetric(float64((db1-db0).Microseconds())/float64(n), "db_cpu_us/row")
		}
		b.Logf("%d rows, chunk %d: backfill enqueued %.0f rows/s (%s); plain SELECT %.0f rows/s", n, chunk, rate, took.Round(time.Millisecond), selectRate)
	}
}
