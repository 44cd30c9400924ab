package outbox

import (
	"context"
	"database/sql"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/state"
)

// BenchmarkSegmentInsert measures what the database spends writing
// segments: segments of 1,000 records shaped like the realistic workload's
// (a name, an amount, a timestamp, a JSON document and a short blob, of
// random content so they compress as real rows do), each written in its
// own transaction the way an enqueue writes them, through the state pool
// (state.Open) as it is (character_set_client=binary) and with the
// server reading statements as UTF-8 (character_set_client=utf8mb4 in the
// DSN). db_cpu_us/record is the server process's CPU per record, read
// from /proc, so it does not move with the machine's load.
func BenchmarkSegmentInsert(b *testing.B) {
	for _, client := range []string{"binary", "utf8mb4"} {
		b.Run("client="+client, func(b *testing.B) {
			srv, db, schema := segmentBenchState(b, func(srv *mysqltest.Server) string {
				if client != "binary" {
					return srv.DSNWith("character_set_client=" + client)
				}
				return srv.DSN
			})
			db.SetMaxOpenConns(1)
			s := NewStore(db, schema, zap.NewNop())
			var got string
			if err := db.QueryRow("SELECT @@session.character_set_client").Scan(&got); err != nil || got != client {
				b.Fatalf("character_set_client = %q, %v; want %s", got, err, client)
			}
			seg := realisticSegment(b, s, "a:app.orders:hook")
			tbl := state.Table(schema, "segments")
			// The server's CPU over the loop, less what the DELETEs that keep
			// the table small took.
			var deletes time.Duration
			b.ResetTimer()
			c0, _ := srv.CPUTime()
			// /proc counts in 10 ms ticks: an op is 100 segments, so even
			// make bench's single op reads a span of many ticks.
			const perOp = 100
			for i := 0; i < b.N*perOp; i++ {
				if i > 0 && i%50 == 0 {
					b.StopTimer()
					d0, _ := srv.CPUTime()
					if _, err := db.Exec("DELETE FROM " + tbl); err != nil {
						b.Fatal(err)
					}
					d1, _ := srv.CPUTime()
					deletes += d1 - d0
					b.StartTimer()
				}
				seg.firstID = fmt.Sprintf("%s%012d", seg.firstID[:len(seg.firstID)-12], i)
				insertSegmentTx(b, db, s, &seg)
			}
			b.StopTimer()
			c1, _ := srv.CPUTime()
			dbCPU := c1 - c0 - deletes
			var stored []byte
			if err := db.QueryRow("SELECT payload FROM " + tbl + " ORDER BY id DESC LIMIT 1").Scan(&stored); err != nil {
				b.Fatal(err)
			}
			if string(stored) != string(seg.payload) {
				b.Fatalf("stored payload of %d bytes differs from the %d sent", len(stored), len(seg.payload))
			}
			perRecord := float64(b.N * perOp * maxSegmentRecords)
			b.ReportMetric(float64(dbCPU.Microseconds())/perRecord, "db_cpu_us/record")
			b.ReportMetric(float64(len(seg.payload))/float64(maxSegmentRecords), "payload_B/record")
		})
	}
}

// realisticSegment is a prepared segment of maxSegmentRecords records of
// the pipe shaped like the realistic workload's rows (random content, so
// it compresses as real rows do).
func realisticSegment(b *testing.B, s *Store, pipe string) encodedSegment {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	blob := make([]byte, 48)
	items := make([]Pending, maxSegmentRecords)
	for i := range items {
		p := gtidItem(pipe, 1, i)
		for j := range blob {
			blob[j] = byte(rng.Uint32())
		}
		p.Change.After["amount"] = fmt.Sprintf("%d.%02d", rng.IntN(100000), rng.IntN(100))
		p.Change.After["at"] = time.UnixMicro(1_700_000_000_000_000 + rng.Int64N(1e12)).UTC().Format("2006-01-02 15:04:05.000000")
		p.Change.After["doc"] = fmt.Sprintf(`{"sku":"S-%d","qty":%d,"tags":["a%d","b%d"]}`, rng.IntN(1e6), rng.IntN(50), rng.IntN(100), rng.IntN(100))
		p.Change.After["data"] = base64.StdEncoding.EncodeToString(blob)
		items[i] = p
	}
	batch, err := s.PrepareBatch(items, nil)
	if err != nil || len(batch.segs) != 1 {
		b.Fatalf("PrepareBatch: %d segments, %v; want one", len(batch.segs), err)
	}
	return batch.segs[0]
}

// segmentBenchState is the shared test server (whose CPU time must be
// readable), a fresh state schema on it, and the engine's state pool to it
// (state.Open: interpolated arguments, MINIMAL row images) through the DSN
// dsn gives.
func segmentBenchState(b *testing.B, dsn func(*mysqltest.Server) string) (*mysqltest.Server, *sql.DB, string) {
	b.Helper()
	srv := mysqltest.Shared(b)
	if _, ok := srv.CPUTime(); !ok {
		b.Skip("the server's CPU time is not readable (CDCOUT_TEST_DSN)")
	}
	_, _, schema := testStore(b)
	pool, err := state.Open(dsn(srv), 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Close() })
	return srv, pool.DB, schema
}

// insertSegmentTx writes seg in a transaction of its own, as an enqueue
// writes a batch's segment.
func insertSegmentTx(b *testing.B, db *sql.DB, s *Store, seg *encodedSegment) {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback()
	if err := s.insertSegment(ctx, tx, seg); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}
