package e2e

import (
	"context"
	"testing"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/redis/go-redis/v9"

	"github.com/cdcout/cdcout/internal/redistest"
)

// readStreams returns the envelopes of every entry of the given streams,
// stream after stream, each in append order. An entry's id field must be
// its body's id: that field is what a consumer drops redeliveries by.
func readStreams(t testing.TB, srv *redistest.Server, streams ...string) []envelope {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	var envs []envelope
	for _, st := range streams {
		msgs, err := c.XRange(context.Background(), st, "-", "+").Result()
		if err != nil {
			t.Fatalf("read stream %s: %v", st, err)
		}
		for _, m := range msgs {
			body, _ := m.Values["body"].(string)
			e, err := parseEnvelope([]byte(body))
			if err != nil {
				t.Errorf("stream %s entry %s: %v", st, m.ID, err)
				continue
			}
			if id := m.Values["id"]; id != e.ID {
				t.Errorf("stream %s entry %s: id field %v, body id %s", st, m.ID, id, e.ID)
			}
			envs = append(envs, e)
		}
	}
	return envs
}

// startPubSub starts the Pub/Sub SDK's fake server (pstest) in the test
// process with the given topics of project, and points every client —
// the cdcout processes the test starts too — at it (PUBSUB_EMULATOR_HOST).
func startPubSub(t *testing.T, project string, topics ...string) *pstest.Server {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { srv.Close() })
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	c, err := pubsub.NewClient(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, topic := range topics {
		if _, err := c.TopicAdminClient.CreateTopic(context.Background(), &pubsubpb.Topic{Name: "projects/" + project + "/topics/" + topic}); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

// readPubSub returns the envelopes of every message published, in publish
// order. A message's ce_id attribute must be its body's id, and its
// ordering key the row key.
func readPubSub(t testing.TB, srv *pstest.Server) []envelope {
	t.Helper()
	var envs []envelope
	for _, m := range srv.Messages() {
		e, err := parseEnvelope(m.Data)
		if err != nil {
			t.Errorf("pubsub message %s: %v", m.ID, err)
			continue
		}
		if m.Attributes["ce_id"] != e.ID || m.OrderingKey != string(e.Key) {
			t.Errorf("pubsub message %s: ce_id %q ordering key %q, body id %s key %s", m.ID, m.Attributes["ce_id"], m.OrderingKey, e.ID, e.Key)
		}
		envs = append(envs, e)
	}
	return envs
}
