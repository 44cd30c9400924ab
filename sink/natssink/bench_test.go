package natssink

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cdcout/cdcout/internal/sinkbench"
)

// BenchmarkNATSSink measures records/s through Deliver into an embedded
// JetStream server (file storage): batches of 250, 8 concurrent calls.
func BenchmarkNATSSink(b *testing.B) {
	rows := sinkbench.Rows(b)
	recs := sinkbench.Records(rows, "nats")
	srv := runServer(b, nil)
	st := addStream(b, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}})
	s := newSink(b, Options{URL: srv.ClientURL()})
	sinkbench.Measure(b, s, recs)
	// The same records every round: the duplicate window keeps one copy.
	checkStored(b, st, rows)
}

// BenchmarkNATSDrain measures the end-to-end drain rate of outbox rows from
// a real MariaDB through outbox.Drainer and this sink into an embedded
// JetStream server (see sinkbench.Drain).
func BenchmarkNATSDrain(b *testing.B) {
	srv := runServer(b, nil)
	st := addStream(b, srv.ClientURL(), jetstream.StreamConfig{Name: "CDC", Subjects: []string{"cdcout.>"}})
	s := newSink(b, Options{URL: srv.ClientURL()})
	// Every run's rows have fresh UUIDv7 ids, so the stream holds them all.
	checkStored(b, st, sinkbench.Drain(b, s, "nats"))
}

// checkStored fails unless the stream holds want messages.
func checkStored(b *testing.B, st jetstream.Stream, want int) {
	info, err := st.Info(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if got := info.State.Msgs; got != uint64(want) {
		b.Fatalf("stream holds %d messages, want %d", got, want)
	}
}
