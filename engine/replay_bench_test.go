package engine

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/replay"
)

// BenchmarkReplay measures a replay's re-delivery rate to a webhook (one
// POST per record, batch_size 100): CDCOUT_BENCH_ROWS inserts (default
// 20,000, one transaction of 1,000 a statement) are delivered, then the
// whole range is replayed by time, b.N times.
func BenchmarkReplay(b *testing.B) {
	n := mysqltest.BenchEnv("CDCOUT_BENCH_ROWS", 20_000)
	var got atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
	}))
	defer hook.Close()
	s := newSource(b, "rbench", "id INT PRIMARY KEY, v INT, pad VARCHAR(64)", func(cfg *config.Config) {
		cfg.Sinks = []config.Sink{{Name: "hook", URL: hook.URL}}
	})
	start := time.Now().UTC().Add(-time.Second).Truncate(time.Second)
	_, cancel, done := startEngine(b, s.cfg)
	defer func() { cancel(); <-done }()
	for lo := 0; lo < n; lo += 1000 {
		var q strings.Builder
		q.WriteString("INSERT INTO `" + s.src + "`.t VALUES ")
		for id := lo; id < min(lo+1000, n); id++ {
			if id > lo {
				q.WriteByte(',')
			}
			fmt.Fprintf(&q, "(%d,0,'padpadpadpadpadpadpadpadpadpad')", id)
		}
		if _, err := s.db.Exec(q.String()); err != nil {
			b.Fatal(err)
		}
	}
	wait := func(what string, cond func() bool) {
		deadline := time.Now().Add(10 * time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				b.Fatalf("%s: timed out", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait("first delivery", func() bool { return got.Load() >= int64(n) })
	r := inspect.Reader{DB: s.db, Schema: s.stateDB, Instance: "rbench"}
	b.ResetTimer()
	began := time.Now()
	for i := 0; i < b.N; i++ {
		before := got.Load()
		st, err := r.StartReplay(context.Background(), "hook", start.Format(time.RFC3339), "", "bench")
		if err != nil {
			b.Fatal(err)
		}
		wait("replay", func() bool {
			list, err := r.Replays(context.Background())
			return err == nil && len(list) > 0 && list[0].ID == st.ID && list[0].Status == replay.Done
		})
		if d := got.Load() - before; d != int64(n) {
			b.Fatalf("replay delivered %d, want %d", d, n)
		}
	}
	b.ReportMetric(float64(n*b.N)/time.Since(began).Seconds(), "records/s")
}
