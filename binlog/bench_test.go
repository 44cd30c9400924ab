package binlog

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/gctune"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// BenchmarkStreamVsRaw reads one binlog of CDCOUT_BENCH_ROWS (default
// 200 000) inserted rows of an 8-column table twice in one run: with a bare
// go-mysql BinlogSyncer (rows parsed, nothing else) and with Stream plus
// canonical.AppendEnvelope per change. It reports both rates (best of
// CDCOUT_BENCH_ROUNDS alternating rounds, default 3) and their ratio; the
// target is stream/raw ≥ 0.5. It also reports the process's CPU per row for
// each reader, which does not move with other load on the machine.
func BenchmarkStreamVsRaw(b *testing.B) {
	rows := 200_000
	if v := os.Getenv("CDCOUT_BENCH_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("CDCOUT_BENCH_ROWS=%q: want a positive integer", v)
		}
		rows = n
	}
	// Both readers run with the garbage collector set as the cdcout binary
	// sets it.
	gctune.Apply()
	srv := mysqltest.Start(b, mysqltest.Options{})
	db := srv.CreateDB(b, "bench")
	srv.Exec(b, "CREATE TABLE `"+db+"`.t (id BIGINT PRIMARY KEY, a INT NOT NULL, b VARCHAR(32), c DECIMAL(12,2), "+
		"d DATETIME(3), e DOUBLE, f TEXT, g TINYINT UNSIGNED)")
	conn := srv.Open(b)
	from := mysqltest.GTIDPos(b, conn)
	const batch = 1000
	start := time.Now()
	for lo := 1; lo <= rows; lo += batch {
		hi := min(lo+batch-1, rows)
		q := fmt.Sprintf("INSERT INTO `%s`.t SELECT seq, seq %% 1000, CONCAT('name-', seq), seq / 100, "+
			"'2024-05-06 07:08:09.123' + INTERVAL seq SECOND, seq * 1.5, REPEAT('x', 40), seq %% 256 FROM (SELECT seq + %d AS seq FROM %s) q", db, lo-1, mysqltest.Seq(hi-lo+1))
		if _, err := conn.Exec(q); err != nil {
			b.Fatalf("insert: %v", err)
		}
	}
	b.Logf("inserted %d rows in %s", rows, time.Since(start).Round(time.Millisecond))

	// The two readers alternate for a few rounds and each keeps its best
	// rate: on a shared machine a neighbour's burst would otherwise decide
	// the ratio.
	rounds := 3
	if v := os.Getenv("CDCOUT_BENCH_ROUNDS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			rounds = n
		}
	}
	b.ResetTimer()
	var rawRate, streamRate float64
	rawCPU, streamCPU := time.Duration(1<<62), time.Duration(1<<62)
	for i := 0; i < b.N; i++ {
		for r := 0; r < rounds; r++ {
			c0 := mysqltest.OwnCPUTime()
			raw := srv.RawReadRate(b, db, from, rows)
			c1 := mysqltest.OwnCPUTime()
			stream := benchStream(b, srv, db, from, rows)
			c2 := mysqltest.OwnCPUTime()
			b.Logf("round %d: raw %.0f rows/s (%.2f µs CPU/row), stream+canonical %.0f rows/s (%.2f µs CPU/row)", r+1,
				raw, float64((c1-c0).Nanoseconds())/1000/float64(rows), stream, float64((c2-c1).Nanoseconds())/1000/float64(rows))
			rawRate, streamRate = max(rawRate, raw), max(streamRate, stream)
			rawCPU, streamCPU = min(rawCPU, c1-c0), min(streamCPU, c2-c1)
		}
	}
	b.StopTimer()
	b.ReportMetric(rawRate, "raw_rows/s")
	b.ReportMetric(streamRate, "stream_rows/s")
	b.ReportMetric(streamRate/rawRate, "stream/raw")
	// CPU per row of this process (reader, decoding, encoding), best
	// round: unlike the rates it does not depend on what else runs on the
	// machine.
	b.ReportMetric(float64(rawCPU.Nanoseconds())/1000/float64(rows), "raw_cpu_us/row")
	b.ReportMetric(float64(streamCPU.Nanoseconds())/1000/float64(rows), "stream_cpu_us/row")
	b.Logf("rows=%d raw=%.0f rows/s stream+canonical=%.0f rows/s ratio=%.2f", rows, rawRate, streamRate, streamRate/rawRate)
}

func benchStream(b *testing.B, srv *mysqltest.Server, db, from string, rows int) float64 {
	b.Helper()
	cfg := testConfig(b, srv, db)
	cfg.Logger = zap.NewNop()
	cfg.From = from
	t0 := time.Now()
	s, err := Open(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	n := 0
	var size int
	buf := make([]byte, 0, 1024)
	done := fmt.Errorf("done")
	err = s.Run(ctx, func(_ context.Context, ev Event) error {
		if ev.Change == nil {
			return nil
		}
		var err error
		if buf, err = canonical.AppendEnvelope(buf[:0], ev.Change, ""); err != nil {
			return err
		}
		size += len(buf)
		if n++; n >= rows {
			return done
		}
		return nil
	})
	if err != done {
		b.Fatalf("stream after %d rows: %v", n, err)
	}
	if !strings.Contains(string(buf), `"op":"c"`) || size == 0 {
		b.Fatalf("unexpected envelope %s", buf)
	}
	return float64(n) / time.Since(t0).Seconds()
}
