package e2e

import (
	"context"
	"testing"

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
