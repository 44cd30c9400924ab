package e2e

import (
	"crypto/rand"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// BenchmarkWideRowRSS is cdcout's peak RSS (VmHWM) while one row with a
// BLOB of 1, 4 and 16 MiB (CDCOUT_BENCH_BLOB_MIB="1,4,16") is inserted and
// then updated (the update's record carries the value twice, before and
// after), each delivered to a webhook; a fresh process per size, so each
// peak is that size's. Target (issue 14): peak ≤ 8 × the row image + the
// idle baseline.
func BenchmarkWideRowRSS(b *testing.B) {
	sizes := []int{1, 4, 16}
	if v := os.Getenv("CDCOUT_BENCH_BLOB_MIB"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("CDCOUT_BENCH_BLOB_MIB=%q: want sizes in MiB like 1,4,16", v)
			}
			sizes = append(sizes, n)
		}
	}
	srv := mysqltest.Shared(b)
	// A 16 MiB value and its 45 MB record exceed the default 16 MiB
	// packet (client, state writes): raised for new connections.
	srv.Exec(b, "SET GLOBAL max_allowed_packet = 1073741824")
	for _, mib := range sizes {
		b.Run(fmt.Sprintf("blob=%dMiB", mib), func(b *testing.B) {
			for range b.N {
				wideRow(b, srv, mib)
			}
		})
	}
}

func wideRow(b *testing.B, srv *mysqltest.Server, mib int) {
	db, src, stateDB, from := srv.NewSource(b, "bench_wide", "id INT PRIMARY KEY, data LONGBLOB NOT NULL")
	hook := newCountingHook(b, nil)
	instance := fmt.Sprintf("wide%d", mib)
	p, log := benchRun(b, srv, stateDB, instance, "--tables", src+".t", "--from", from, "--sink", "hook="+hook.srv.URL)
	// The idle baseline is the process after one narrow row went the whole
	// way: the pages of the binary that capture, enqueue and delivery run
	// (most of the RSS of an idle cdcout is the binary's own file pages)
	// are then in, so the peaks below are what the wide row itself costs.
	if _, err := db.Exec("INSERT INTO `" + src + "`.t VALUES (0, 'narrow')"); err != nil {
		b.Fatal(err)
	}
	waitFor(b, time.Minute, func() (bool, string) {
		return hook.distinct() > 0, "the narrow row not delivered"
	})
	time.Sleep(time.Second) // settle
	base := peakRSS(p.cmd.Process.Pid)
	value := func() []byte {
		v := make([]byte, mib<<20)
		_, _ = rand.Read(v) // incompressible
		return v
	}
	var peaks [2]int64
	for i, stmt := range []string{"INSERT INTO `" + src + "`.t VALUES (1, ?)", "UPDATE `" + src + "`.t SET data = ? WHERE id = 1"} {
		if _, err := db.Exec(stmt, value()); err != nil {
			b.Fatal(err)
		}
		waitFor(b, 5*time.Minute, func() (bool, string) {
			if p.exited() {
				b.Fatalf("cdcout exited: %v", p.err)
			}
			peaks[i] = max(peaks[i], peakRSS(p.cmd.Process.Pid))
			n := hook.distinct()
			return n > i+1, fmt.Sprintf("%d of %d delivered", n-1, i+1)
		})
		time.Sleep(500 * time.Millisecond)
		peaks[i] = max(peaks[i], peakRSS(p.cmd.Process.Pid))
	}
	if code := p.stop(30 * time.Second); code != 0 {
		b.Fatalf("cdcout exit code %d after SIGTERM", code)
	}
	if os.Getenv("CDCOUT_BENCH_GCTRACE") != "" {
		b.Log(log.tail(60))
	}
	mb := func(n int64) float64 { return float64(n) / (1 << 20) }
	b.ReportMetric(mb(base), "idle_rss_MB")
	b.ReportMetric(mb(peaks[0]), "insert_peak_rss_MB")
	b.ReportMetric(mb(peaks[1]), "update_peak_rss_MB")
	b.Logf("%d MiB BLOB: idle %.0f MB, peak after insert %.0f MB (target %.0f), after update %.0f MB (target %.0f)",
		mib, mb(base), mb(peaks[0]), mb(base)+8*float64(mib), mb(peaks[1]), mb(base)+8*float64(2*mib))
}
