package kafkasink

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/cdcout/cdcout/internal/sinkbench"
)

// BenchmarkKafkaSink measures records/s through Deliver into kfake:
// batches of 250, 8 concurrent calls (the sink defaults' concurrency).
func BenchmarkKafkaSink(b *testing.B) {
	rows := sinkbench.Rows(b)
	recs := sinkbench.Records(rows, "kafka")
	c := newCluster(b, kfake.SeedTopics(16, "bench.shop.items"))
	s := newSink(b, c, Options{})
	sinkbench.Measure(b, s, recs)
	checkStored(b, s, rows*b.N)
}

// BenchmarkKafkaDrain measures the end-to-end drain rate of outbox rows
// from a real MariaDB through outbox.Drainer and this sink into kfake (see
// sinkbench.Drain).
func BenchmarkKafkaDrain(b *testing.B) {
	c := newCluster(b, kfake.SeedTopics(16, "bench.shop.items"))
	s := newSink(b, c, Options{})
	checkStored(b, s, sinkbench.Drain(b, s, "kafka"))
}

// checkStored fails unless the topic holds want records.
func checkStored(b *testing.B, s *Sink, want int) {
	ends, err := kadm.NewClient(s.client).ListEndOffsets(context.Background(), "bench.shop.items")
	if err != nil {
		b.Fatal(err)
	}
	var stored int64
	ends.Each(func(o kadm.ListedOffset) { stored += o.Offset })
	if stored != int64(want) {
		b.Fatalf("topic holds %d records, want %d", stored, want)
	}
}
