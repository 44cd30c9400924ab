package pubsubsink

import (
	"context"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"

	"github.com/cdcout/cdcout/internal/sinktest"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

// emulator starts the Pub/Sub SDK's in-process fake server (pstest) and
// points the client at it as PUBSUB_EMULATOR_HOST does for an emulator.
func emulator(t *testing.T, opts ...pstest.ServerReactorOption) *pstest.Server {
	srv := pstest.NewServer(opts...)
	t.Cleanup(func() { srv.Close() })
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	return srv
}

func createTopic(t *testing.T, project, topic string) {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.TopicAdminClient.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topic}); err != nil {
		t.Fatal(err)
	}
}

func newSink(t *testing.T, url string) *Sink {
	t.Helper()
	o, err := ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func deliver(t *testing.T, s *Sink, recs ...outbox.Record) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return s.Deliver(ctx, recs)
}

func TestDeliverPublishesWithOrderingKeyAndID(t *testing.T) {
	srv := emulator(t)
	createTopic(t, "proj", "cdc.shop.items")
	s := newSink(t, "pubsub://proj/cdc.{db}.{table}")
	recs := []outbox.Record{sinktest.Record("pubsub", "a", 1), sinktest.Record("pubsub", "b", 1)}
	sinktest.NoErrors(t, deliver(t, s, recs...))
	sinktest.NoErrors(t, deliver(t, s, sinktest.Record("pubsub", "a", 2)))
	msgs := srv.Messages()
	if len(msgs) != 3 {
		t.Fatalf("server has %d messages, want 3", len(msgs))
	}
	byID := map[string]*pstest.Message{}
	for _, m := range msgs {
		byID[m.Attributes["ce_id"]] = m
	}
	for _, rec := range append(recs, sinktest.Record("pubsub", "a", 2)) {
		m := byID[rec.ID]
		if m == nil {
			t.Fatalf("no message with ce_id %s", rec.ID)
		}
		if m.OrderingKey != rec.Key || string(m.Data) != string(rec.Payload) || m.Topic != "projects/proj/topics/cdc.shop.items" {
			t.Errorf("message %s: ordering key %q data %s topic %s, want %q %s", rec.ID, m.OrderingKey, m.Data, m.Topic, rec.Key, rec.Payload)
		}
		if m.Attributes["ce_type"] != "cdcout.change.c" || m.Attributes["content-type"] != "application/json" {
			t.Errorf("message %s attributes %v", rec.ID, m.Attributes)
		}
	}
}

// TestMissingTopicIsRetriedThenDelivered: a topic created after the pipe
// is retried (not dead-lettered), and the record's ordering key is open
// again for the retry.
func TestMissingTopicIsRetriedThenDelivered(t *testing.T) {
	srv := emulator(t)
	s := newSink(t, "pubsub://proj/late")
	rec := sinktest.Record("pubsub", "a", 1)
	err := deliver(t, s, rec)[0]
	if err == nil || sink.IsPermanent(err) || !strings.Contains(err.Error(), "does not exist; create it") {
		t.Fatalf("publish to a missing topic: %v, want a retryable error saying to create it", err)
	}
	createTopic(t, "proj", "late")
	sinktest.NoErrors(t, deliver(t, s, rec))
	if n := len(srv.Messages()); n != 1 {
		t.Fatalf("server has %d messages, want 1", n)
	}
}

func TestParseURL(t *testing.T) {
	o, err := ParseURL("pubsub://my-proj/cdc.%7Bdb%7D.{table}")
	if err != nil || o.Project != "my-proj" || o.TopicTemplate != "cdc.{db}.{table}" {
		t.Fatalf("ParseURL = %+v, %v", o, err)
	}
	for _, bad := range []string{"pubsub:///topic", "pubsub://", "http://p/t"} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) accepted", bad)
		}
	}
	if got, want := topicSafe("order items/é"), "order_items__"; got != want {
		t.Errorf("topicSafe = %q, want %q", got, want)
	}
}

// TestBusyServerIsOverload: RESOURCE_EXHAUSTED is the server's pace, not
// the record's fault: overload, never an attempt that could dead-letter.
func TestBusyServerIsOverload(t *testing.T) {
	emulator(t, pstest.WithErrorInjection("Publish", codes.ResourceExhausted, "quota"))
	createTopic(t, "proj", "busy")
	o, _ := ParseURL("pubsub://proj/busy")
	o.Timeout = 2 * time.Second
	s, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = s.Deliver(ctx, []outbox.Record{sinktest.Record("pubsub", "a", 1)})[0]
	if err == nil || !sink.IsOverloaded(err) || sink.IsPermanent(err) {
		t.Fatalf("publish to a busy server: %v, want an overload error", err)
	}
}
