package sinktest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// RunNATS starts an embedded JetStream server on a random port, its store
// in the test's temporary directory; edit (if not nil) changes the options
// first (a payload limit, credentials). The server is shut down, and waited
// for, when the test ends.
func RunNATS(t testing.TB, edit func(*server.Options)) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      -1,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	if edit != nil {
		edit(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

// AddStream creates a JetStream stream on the server at url (connecting
// with connOpts) and returns a handle to inspect it.
func AddStream(t testing.TB, url string, cfg jetstream.StreamConfig, connOpts ...nats.Option) jetstream.Stream {
	t.Helper()
	nc, err := nats.Connect(url, connOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// ConsumeKafka reads n records of the topics from their start, failing if
// they have not all come within timeout.
func ConsumeKafka(t testing.TB, c *kfake.Cluster, timeout time.Duration, n int, topics ...string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of %d records before the deadline", len(out), n)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}
