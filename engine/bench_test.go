package engine

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// BenchmarkEndToEnd measures changes/s from the first commit to the last
// delivery through a file sink and an HTTP sink. CDCOUT_BENCH_ROWS sets the
// number of inserts (default 50,000); a fifth as many updates and deletes
// follow.
func BenchmarkEndToEnd(b *testing.B) {
	n := 50_000
	if v, err := strconv.Atoi(os.Getenv("CDCOUT_BENCH_ROWS")); err == nil && v > 0 {
		n = v
	}
	srv := mysqltest.Shared(b)
	for i := 0; i < b.N; i++ {
		src := srv.CreateDB(b, "bench_src")
		stateDB := srv.CreateDB(b, "bench_state")
		srv.Exec(b, "CREATE TABLE `"+src+"`.t (id INT PRIMARY KEY, v INT, pad VARCHAR(64))")
		db := srv.Open(b)
		var from string
		if err := db.QueryRow("SELECT @@gtid_binlog_pos").Scan(&from); err != nil {
			b.Fatal(err)
		}
		var got atomic.Int64
		hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			got.Add(1)
		}))
		cfg := config.Default()
		cfg.DSN = config.DSN(srv.DSN)
		cfg.StateDB = stateDB
		cfg.Instance = "bench"
		cfg.From = from
		cfg.HTTPAddr = "off"
		cfg.Sinks = []config.Sink{
			{Name: "hook", URL: hook.URL, BatchSize: 200, Concurrency: 8},
			{Name: "file", URL: "file://" + filepath.Join(b.TempDir(), "out.jsonl"), BatchSize: 500},
		}
		if _, err := reresolve(cfg); err != nil {
			b.Fatal(err)
		}
		e, err := New(cfg, zap.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()

		start := time.Now()
		const chunk = 1000
		for lo := 0; lo < n; lo += chunk {
			q := "INSERT INTO `" + src + "`.t VALUES "
			for id := lo; id < min(lo+chunk, n); id++ {
				if id > lo {
					q += ","
				}
				q += fmt.Sprintf("(%d,0,'padpadpadpadpadpadpadpadpadpad')", id)
			}
			if _, err := db.Exec(q); err != nil {
				b.Fatal(err)
			}
		}
		upd := n / 5
		for lo := 0; lo < upd; lo += chunk {
			if _, err := db.Exec(fmt.Sprintf("UPDATE `%s`.t SET v = 1 WHERE id >= %d AND id < %d", src, lo, min(lo+chunk, upd))); err != nil {
				b.Fatal(err)
			}
		}
		for lo := upd; lo < 2*upd; lo += chunk {
			if _, err := db.Exec(fmt.Sprintf("DELETE FROM `%s`.t WHERE id >= %d AND id < %d", src, lo, min(lo+chunk, 2*upd))); err != nil {
				b.Fatal(err)
			}
		}
		writeDone := time.Since(start)
		total := int64(n + 2*upd)
		outbox := "`" + stateDB + "`.outbox"
		deadline := time.Now().Add(10 * time.Minute)
		var enqueued time.Duration
		for {
			var delivered, rows int64
			_ = db.QueryRow("SELECT COUNT(*), COALESCE(SUM(status = 'delivered'), 0) FROM "+outbox).Scan(&rows, &delivered)
			if enqueued == 0 && rows >= 2*total {
				enqueued = time.Since(start)
			}
			if delivered >= 2*total && got.Load() >= total {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("timed out: %d of %d delivered", delivered, 2*total)
			}
			time.Sleep(200 * time.Millisecond)
		}
		elapsed := time.Since(start)
		st := e.Stats()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		hook.Close()
		b.ReportMetric(float64(total)/elapsed.Seconds(), "changes/s")
		b.ReportMetric(writeDone.Seconds(), "write_s")
		b.ReportMetric(elapsed.Seconds(), "e2e_s")
		b.ReportMetric(enqueued.Seconds(), "enqueued_s")
		b.ReportMetric(st.EnqueueTime.Seconds(), "in_enqueue_tx_s")
		b.ReportMetric(float64(st.Batches), "batches")
	}
}
