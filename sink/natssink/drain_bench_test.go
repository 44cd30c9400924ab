package natssink

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/state"
)

// BenchmarkNATSDrain measures the end-to-end drain rate: CDCOUT_BENCH_ROWS
// outbox rows (default 200,000, over a quarter as many keys so per-key order
// is in play) claimed by outbox.Drainer from a real MariaDB, published
// through the NATS sink to an embedded JetStream server (file storage) and
// recorded as delivered, with batches of 500 and 8 concurrent calls.
// Enqueueing the rows is not timed. "sink-share" is the fraction of the
// drain's wall time some Deliver call of the sink was running: a low share
// means the drainer's database work, not the sink, bounds the rate.
func BenchmarkNATSDrain(b *testing.B) {
	rows := benchRows(b)
	db0 := mysqltest.Start(b, mysqltest.Options{})
	const pipe = "bench:shop.items:nats"
	srv := runServer(b, nil)
	st := addStream(b, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}})
	s := &busySink{s: newSink(b, Options{URL: srv.ClientURL()})}
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		db := db0.Open(b)
		schema := db0.CreateDB(b, "ndrain")
		if err := state.Migrate(context.Background(), db, schema); err != nil {
			b.Fatal(err)
		}
		enqueueBench(b, outbox.NewStore(db, schema, zap.NewNop()), pipe, "nats", rows)
		analyzeIfAsked(b, db, schema)
		var delivered atomic.Int64
		d, err := outbox.NewDrainer(outbox.DrainerConfig{
			DB: db, Schema: schema, ClaimedBy: fmt.Sprintf("bench/%d", i),
			Pipes:   map[string]outbox.PipeConfig{pipe: {Sink: s, BatchSize: 500, Concurrency: 8}},
			Metrics: outbox.DrainMetrics{Delivered: func(_ string, n int) { delivered.Add(int64(n)) }},
		})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { done <- d.Run(ctx) }()
		waitDelivered(b, &delivered, rows)
		total += time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*b.N)/total.Seconds(), "rows/s")
	b.ReportMetric(s.busy().Seconds()/total.Seconds(), "sink-share")
	info, err := st.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	// Every run's records have fresh ids only if the outbox ids differ;
	// they do (UUIDv7), so the stream holds them all.
	if got := info.State.Msgs; got != uint64(rows*b.N) {
		b.Fatalf("stream holds %d messages, want %d", got, rows*b.N)
	}
}

func waitDelivered(b *testing.B, delivered *atomic.Int64, rows int) {
	deadline := time.Now().Add(30 * time.Minute)
	for delivered.Load() < int64(rows) {
		if time.Now().After(deadline) {
			b.Fatalf("drained %d of %d rows in 30 minutes", delivered.Load(), rows)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// analyzeIfAsked refreshes the outbox's index statistics when
// CDCOUT_BENCH_ANALYZE=1. Right after a bulk enqueue InnoDB's statistics can
// be stale enough for the optimizer to probe a key's earlier rows through
// the (pipe, status, …) index instead of a per-key one, which makes claims
// orders of magnitude slower; comparing runs with and without this shows
// how much of the drain rate that plan costs.
func analyzeIfAsked(b *testing.B, db *sql.DB, schema string) {
	if os.Getenv("CDCOUT_BENCH_ANALYZE") != "1" {
		return
	}
	if _, err := db.Exec("ANALYZE TABLE " + state.Table(schema, "outbox")); err != nil {
		b.Fatal(err)
	}
}

// busySink measures the wall time during which at least one Deliver call
// is running.
type busySink struct {
	s       outbox.Sink
	running atomic.Int64
	since   atomic.Int64 // unix ns when running went 0 → 1
	total   atomic.Int64
}

func (t *busySink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	if t.running.Add(1) == 1 {
		t.since.Store(time.Now().UnixNano())
	}
	defer func() {
		if t.running.Add(-1) == 0 {
			t.total.Add(time.Now().UnixNano() - t.since.Load())
		}
	}()
	return t.s.Deliver(ctx, recs)
}

func (t *busySink) busy() time.Duration { return time.Duration(t.total.Load()) }

// enqueueBench writes rows pending inserts for pipe through the outbox's
// own Enqueue, over rows/4 keys.
func enqueueBench(b *testing.B, st *outbox.Store, pipe, sinkName string, rows int) {
	b.Helper()
	const chunk = 5000
	for start := 0; start < rows; start += chunk {
		items := make([]outbox.Pending, 0, chunk)
		for j := start; j < min(start+chunk, rows); j++ {
			key := canonical.Row{"id": int64(j % max(rows/4, 1))}
			after := canonical.Row{"id": key["id"], "name": fmt.Sprintf("item %d", j), "price": "12.50", "qty": int64(3)}
			ch := &canonical.Change{
				Op: canonical.OpCreate, After: after, Key: key, TsMs: 1764420000123,
				Source: canonical.Source{Connector: "cdcout", Version: "dev", Instance: "bench", DB: "shop", Table: "items",
					ServerID: 1, GTID: fmt.Sprintf("0-1-%d", j+1), File: "mysql-bin.000003", Pos: 1234, TsMs: 1764420000000},
			}
			items = append(items, outbox.Pending{
				Pipe: pipe, Sink: sinkName, Change: ch,
				ChangeKey: fmt.Sprintf("g:0-1-%d:0", j+1),
				Digest:    canonical.Digest(pipe, ch.Op, key, after, nil),
			})
		}
		if _, err := st.Enqueue(context.Background(), "bench", outbox.Fence{}, items, nil); err != nil {
			b.Fatal(err)
		}
	}
}
