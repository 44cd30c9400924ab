package engine

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
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
	n := mysqltest.BenchEnv("CDCOUT_BENCH_ROWS", 50_000)
	for i := 0; i < b.N; i++ {
		var got atomic.Int64
		hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			got.Add(1)
		}))
		s := newSource(b, "bench", "id INT PRIMARY KEY, v INT, pad VARCHAR(64)", func(cfg *config.Config) {
			cfg.Sinks = []config.Sink{
				{Name: "hook", URL: hook.URL, BatchSize: 200, Concurrency: 8},
				{Name: "file", URL: "file://" + filepath.Join(b.TempDir(), "out.jsonl"), BatchSize: 500},
			}
		})
		db, src, stateDB := s.db, s.src, s.stateDB
		e, cancel, done := startEngine(b, s.cfg)

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
		deadline := time.Now().Add(10 * time.Minute)
		var enqueued time.Duration
		for {
			rows, delivered := outboxProgress(db, stateDB)
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
		b.ReportMetric(st.EnqueueWait.Seconds(), "enqueue_wait_s")
		b.ReportMetric(float64(st.Batches), "batches")
	}
}

// BenchmarkLatency measures commit → webhook delivery latency at a steady
// write rate (CDCOUT_BENCH_RATE changes/s, default 2000) for
// CDCOUT_BENCH_SECONDS (default 20), and reports p50/p99.
func BenchmarkLatency(b *testing.B) {
	rate := mysqltest.BenchEnv("CDCOUT_BENCH_RATE", 2000)
	secs := mysqltest.BenchEnv("CDCOUT_BENCH_SECONDS", 20)
	for i := 0; i < b.N; i++ {
		total := rate * secs
		committed := make([]atomic.Int64, total) // unix ns of each id's commit
		lat := make(chan time.Duration, total)
		hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			now := time.Now().UnixNano()
			body, _ := io.ReadAll(r.Body)
			var env struct{ After struct{ ID int } }
			if json.Unmarshal(body, &env) == nil && env.After.ID < total {
				if c := committed[env.After.ID].Load(); c > 0 {
					lat <- time.Duration(now - c)
				}
			}
		}))
		s := newSource(b, "lat", "id BIGINT PRIMARY KEY", func(cfg *config.Config) {
			cfg.Sinks = []config.Sink{{Name: "hook", URL: hook.URL}}
		})
		db, src := s.db, s.src
		_, cancel, done := startEngine(b, s.cfg)

		// 100 transactions a second, rate/100 rows each.
		per := max(rate/100, 1)
		tick := time.NewTicker(10 * time.Millisecond)
		id := 0
		for id < total {
			<-tick.C
			q := "INSERT INTO `" + src + "`.t VALUES "
			lo := id
			for ; id < min(lo+per, total); id++ {
				if id > lo {
					q += ","
				}
				q += "(" + strconv.Itoa(id) + ")"
			}
			if _, err := db.Exec(q); err != nil {
				b.Fatal(err)
			}
			now := time.Now().UnixNano()
			for j := lo; j < id; j++ {
				committed[j].Store(now)
			}
		}
		tick.Stop()
		var ds []time.Duration
		deadline := time.After(2 * time.Minute)
	collect:
		for len(ds) < total {
			select {
			case d := <-lat:
				ds = append(ds, d)
			case <-deadline:
				break collect
			}
		}
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		hook.Close()
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		if len(ds) == 0 {
			b.Fatal("no deliveries")
		}
		b.ReportMetric(float64(ds[len(ds)/2].Milliseconds()), "p50_ms")
		b.ReportMetric(float64(ds[len(ds)*99/100].Milliseconds()), "p99_ms")
		b.ReportMetric(float64(len(ds)), "delivered")
	}
}

// BenchmarkHugeTransaction enqueues one transaction of CDCOUT_BENCH_ROWS
// rows (default 1,000,000) and reports the process's peak RSS: the
// enqueuer writes it in parts of enqueue_max_buffer rows, so memory must
// not grow with the transaction.
func BenchmarkHugeTransaction(b *testing.B) {
	n := mysqltest.BenchEnv("CDCOUT_BENCH_ROWS", 1_000_000)
	for i := 0; i < b.N; i++ {
		s := newSource(b, "huge", "id BIGINT PRIMARY KEY, pad VARCHAR(100)", func(cfg *config.Config) {
			cfg.Sinks = []config.Sink{{Name: "out", URL: "file://" + filepath.Join(b.TempDir(), "o.jsonl")}}
		})
		db, src, stateDB := s.db, s.src, s.stateDB
		e, cancel, done := startEngine(b, s.cfg)
		start := time.Now()
		if _, err := db.Exec(fmt.Sprintf("INSERT INTO `%s`.t SELECT seq, REPEAT('x', 100) FROM %s", src, mysqltest.Seq(n))); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Minute)
		for {
			rows, _ := outboxProgress(db, stateDB)
			if rows >= int64(n) {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("enqueued %d of %d", rows, n)
			}
			time.Sleep(time.Second)
		}
		elapsed := time.Since(start)
		st := e.Stats()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(peakRSSMB(), "peak_rss_MB")
		b.ReportMetric(float64(st.MaxBuffered), "max_buffered_rows")
		b.ReportMetric(float64(n)/elapsed.Seconds(), "rows/s")
	}
}

// startEngine runs an engine of cfg in the background (silent); cancel
// stops it and done yields Run's result.
// outboxProgress counts the records enqueued and those delivered, in SQL
// over segments and rows: cheap enough to poll while a million records
// are enqueued, where outbox.ReadRecords decodes every segment. Every
// outbox row left a done segment and is still counted in its records; a
// record of a done segment was delivered unless its row says otherwise.
func outboxProgress(db *sql.DB, stateDB string) (records, delivered int64) {
	q := "`" + stateDB + "`."
	_ = db.QueryRow("SELECT (SELECT COALESCE(SUM(records), 0) FROM "+q+"segments),"+
		" (SELECT COALESCE(SUM(records), 0) FROM "+q+"segments WHERE status = 'done')"+
		" - (SELECT COUNT(*) FROM "+q+"outbox WHERE status <> 'delivered')").Scan(&records, &delivered)
	return records, delivered
}

func startEngine(b *testing.B, cfg *config.Config) (*Engine, context.CancelFunc, <-chan error) {
	b.Helper()
	e, err := New(cfg, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	return e, cancel, done
}

// peakRSSMB is the process's VmHWM in MB (0 where /proc is missing).
func peakRSSMB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return float64(kb) / 1024
		}
	}
	return 0
}
