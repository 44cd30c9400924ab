package natssink

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// benchRows is the number of records per benchmark run (CDCOUT_BENCH_ROWS).
func benchRows(b *testing.B) int {
	if v := os.Getenv("CDCOUT_BENCH_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			b.Fatalf("CDCOUT_BENCH_ROWS=%q", v)
		}
		return n
	}
	return 200_000
}

// benchRecords builds n records with distinct keys and envelope-sized
// payloads (~450 bytes).
func benchRecords(n int) []outbox.Record {
	recs := make([]outbox.Record, n)
	for i := range recs {
		id := fmt.Sprintf("0192f3a0-0000-7000-8000-%012d", i)
		recs[i] = outbox.Record{
			ID: id, Pipe: "bench:shop.items:nats", Sink: "nats", DB: "shop", Table: "items",
			Op: canonical.OpUpdate, Key: fmt.Sprintf(`{"id":%d}`, i), Attempt: 1,
			CommitTime: time.Unix(1764420000, 0),
			Payload: fmt.Appendf(nil, `{"after":{"id":%d,"name":"item %d","price":"12.50","qty":3},`+
				`"before":{"id":%d,"name":"item %d","price":"9.90","qty":3},"change_key":"g:0-1-%d:0",`+
				`"id":%q,"key":{"id":%d},"op":"u","source":{"connector":"cdcout","db":"shop","file":"mysql-bin.000003",`+
				`"gtid":"0-1-%d","instance":"bench","pos":1234,"row":0,"server_id":1,"table":"items","ts_ms":1764420000000,`+
				`"version":"dev"},"ts_ms":1764420000123}`, i, i, i, i, i, id, i, i),
		}
	}
	return recs
}

// deliverAll pushes recs through s in batches from conc goroutines, as the
// drainer does, and fails on any error.
func deliverAll(b *testing.B, s outbox.Sink, recs []outbox.Record, batch, conc int) {
	var wg sync.WaitGroup
	next := make(chan []outbox.Record)
	for range conc {
		wg.Go(func() {
			for call := range next {
				for i, err := range s.Deliver(context.Background(), call) {
					if err != nil {
						b.Errorf("record %s: %v", call[i].ID, err)
						return
					}
				}
			}
		})
	}
	for i := 0; i < len(recs); i += batch {
		next <- recs[i:min(i+batch, len(recs))]
	}
	close(next)
	wg.Wait()
}

// BenchmarkNATSSink measures records/s through Deliver into an embedded
// JetStream server (file storage): batches of 250, 8 concurrent calls.
func BenchmarkNATSSink(b *testing.B) {
	rows := benchRows(b)
	recs := benchRecords(rows)
	srv := runServer(b, nil)
	st := addStream(b, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}})
	s := newSink(b, Options{URL: srv.ClientURL()})
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		deliverAll(b, s, recs, 250, 8)
	}
	b.ReportMetric(float64(rows*b.N)/time.Since(start).Seconds(), "records/s")
	b.StopTimer()
	info, err := st.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if got := info.State.Msgs; got != uint64(rows) {
		b.Fatalf("stream holds %d messages, want %d", got, rows)
	}
}
