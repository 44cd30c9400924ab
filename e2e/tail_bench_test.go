package e2e

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/benchload"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// BenchmarkTailBinary is issue 19's `cdcout tail` → /dev/null: the real
// binary reads a binlog of CDCOUT_BENCH_ROWS (default 200,000) changes of
// each workload (internal/benchload: narrow and realistic;
// CDCOUT_BENCH_WORKLOADS picks) from its first change with --limit, and
// the bare go-mysql read of the same binlog and the canal loop
// (mysqltest.Server.CanalReadRate) run beside it. It reports the tail's
// changes/s (from start to exit), its ratios to the bare read and to the
// canal loop, the ratio of the two steady rates (the tail's from when it
// logs that its source is ready, the canal loop's from its first rows
// event: without the process's start, about 0.1 s of a 200k run, the
// connection and the checks), and
// its CPU per change (the child's user + system time).
// Targets (issue 19): ≥ 0.6× the bare read on realistic rows, and ≥ 1.4×
// the canal loop.
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
				canal, canalSteady := srv.CanalReadRate(b, db, from, n)
				devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
				if err != nil {
					b.Fatal(err)
				}
				cmd := exec.Command(binPath, "tail", "--dsn", srv.DSN, "--tables", db+".t", "--from", from,
					"--limit", strconv.Itoa(n), "--log-format", "json", "--log-level", "info")
				cmd.Stdout = devNull
				logs, err := cmd.StderrPipe()
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				if err := cmd.Start(); err != nil {
					b.Fatal(err)
				}
				ready := readyAt(logs)
				err = cmd.Wait()
				elapsed := time.Since(start)
				devNull.Close()
				if err != nil {
					b.Fatalf("cdcout tail: %v", err)
				}
				if ready.IsZero() {
					b.Fatal("cdcout tail never logged that its binlog source was ready")
				}
				steady := float64(n) / time.Since(ready).Seconds()
				cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
				rate := float64(n) / elapsed.Seconds()
				perChange := float64(cpu.Nanoseconds()) / 1000 / float64(n)
				b.ReportMetric(rate, "changes/s")
				b.ReportMetric(rate/raw, "x_raw")
				b.ReportMetric(rate/canal, "x_canal")
				b.ReportMetric(steady/canalSteady, "x_canal_steady")
				b.ReportMetric(perChange, "cdcout_cpu_us/change")
				b.Logf("%s: %d changes through cdcout tail → /dev/null in %s: %.0f changes/s (%.2f× the bare read's %.0f/s, %.2f× the canal loop's %.0f/s); from the source ready on %.0f/s, %.2f× the canal loop's from its first rows event (%.0f/s); cdcout CPU %.2f µs a change",
					w.Name, n, elapsed.Round(time.Millisecond), rate, rate/raw, raw, rate/canal, canal, steady, steady/canalSteady, canalSteady, perChange)
			}
		})
	}
}

// readyAt reads tail's log to its end, passing on all but its info lines,
// and returns when it logged that its binlog source was ready: connected,
// checked and about to stream.
func readyAt(r io.Reader) (ready time.Time) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, `"binlog source ready"`):
			ready = time.Now()
		case !strings.Contains(line, `"level":"info"`):
			fmt.Fprintln(os.Stderr, line)
		}
	}
	return ready
}
