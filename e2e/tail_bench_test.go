package e2e

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/benchload"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// BenchmarkTailBinary is issue 19's `cdcout tail` → /dev/null: the real
// binary reads a binlog of CDCOUT_BENCH_ROWS (default 200,000) changes of
// each workload (internal/benchload: narrow and realistic;
// CDCOUT_BENCH_WORKLOADS picks) from its first change with --limit, and
// the bare go-mysql read of the same binlog runs beside it. It reports
// the tail's changes/s (from start to exit), its ratio to the bare read and
// its CPU per change (the child's user + system time). Target (issue 19):
// ≥ 0.6× the bare read on realistic rows.
func BenchmarkTailBinary(b *testing.B) {
	srv := mysqltest.Start(b, mysqltest.Options{})
	conn := srv.Open(b)
	changes := mysqltest.BenchEnv("CDCOUT_BENCH_ROWS", 200_000)
	for _, w := range benchload.Picked(benchload.Narrow, benchload.Realistic) {
		b.Run(w.Name, func(b *testing.B) {
			db := srv.CreateDB(b, "tbench_"+w.Name)
			from := gtidPos(b, conn)
			n := benchload.Load(b, srv, conn, db, w, changes)
			for range b.N {
				raw := srv.RawReadRate(b, db, from, n)
				devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
				if err != nil {
					b.Fatal(err)
				}
				cmd := exec.Command(binPath, "tail", "--dsn", srv.DSN, "--tables", db+".t", "--from", from,
					"--limit", strconv.Itoa(n), "--log-format", "json", "--log-level", "warn")
				cmd.Stdout, cmd.Stderr = devNull, os.Stderr
				start := time.Now()
				err = cmd.Run()
				elapsed := time.Since(start)
				devNull.Close()
				if err != nil {
					b.Fatalf("cdcout tail: %v", err)
				}
				cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
				rate := float64(n) / elapsed.Seconds()
				perChange := float64(cpu.Nanoseconds()) / 1000 / float64(n)
				b.ReportMetric(rate, "changes/s")
				b.ReportMetric(rate/raw, "x_raw")
				b.ReportMetric(perChange, "cdcout_cpu_us/change")
				b.Logf("%s: %d changes through cdcout tail → /dev/null in %s: %.0f changes/s (%.2f× the bare read's %.0f/s); cdcout CPU %.2f µs a change",
					w.Name, n, elapsed.Round(time.Millisecond), rate, rate/raw, raw, perChange)
			}
		})
	}
}
