package outbox

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// BenchmarkSegmentRead measures what reading a pending segment ahead
// costs (readNext, as a drainer does while the segment before it goes
// out): from the table, and with its payload kept by this process
// (Recent), where the query leaves the payload out. Segments of 1,000
// realistic records (BenchmarkSegmentInsert's). db_cpu_us/record is the
// server process's CPU per record, from /proc; cpu_us/record this
// process's, from getrusage.
func BenchmarkSegmentRead(b *testing.B) {
	for _, from := range []string{"table", "memory"} {
		b.Run("from="+from, func(b *testing.B) {
			srv, db, schema := segmentBenchState(b, func(srv *mysqltest.Server) string { return srv.DSN })
			s := NewStore(db, schema, zap.NewNop())
			const pipe = "a:app.orders:hook"
			seg := realisticSegment(b, s, pipe)
			// perOp segments, each read once an op: /proc counts in 10 ms
			// ticks, so make bench's single op reads a span of many.
			const perOp = 200
			ids := make([]string, perOp)
			ctx := context.Background()
			for i := range ids {
				seg.firstID = fmt.Sprintf("%s%012d", seg.firstID[:len(seg.firstID)-12], i)
				ids[i] = seg.firstID
				insertSegmentTx(b, db, s, &seg)
			}
			recent := NewRecent(DefaultRecentBytes)
			cfg := DrainerConfig{DB: db, Schema: schema, ClaimedBy: "bench", Pipes: map[string]PipeConfig{pipe: {Sink: fakeSink{}}}}
			if from == "memory" {
				cfg.Recent = recent
			}
			d, err := NewDrainer(cfg)
			if err != nil {
				b.Fatal(err)
			}
			p := d.pipes[0]
			b.ResetTimer()
			c0, _ := srv.CPUTime()
			u0 := processCPU()
			for range b.N {
				after := ""
				for _, id := range ids {
					if from == "memory" {
						b.StopTimer()
						recent.put(id, pipe, seg.payload)
						b.StartTimer()
					}
					next, err := p.readNext(ctx, after)
					if err != nil || next == nil || next.id != id || len(next.recs) != maxSegmentRecords {
						b.Fatalf("read after %q: %v, %v; want segment %s of %d records", after, next, err, id, maxSegmentRecords)
					}
					after = id
				}
			}
			b.StopTimer()
			c1, _ := srv.CPUTime()
			u1 := processCPU()
			if from == "memory" && recent.Hits() != int64(b.N*perOp) {
				b.Fatalf("%d segments read from memory, want %d", recent.Hits(), b.N*perOp)
			}
			perRecord := float64(b.N * perOp * maxSegmentRecords)
			b.ReportMetric(float64((c1-c0).Microseconds())/perRecord, "db_cpu_us/record")
			b.ReportMetric(float64((u1-u0).Microseconds())/perRecord, "cpu_us/record")
		})
	}
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
