package stdoutsink

import (
	"bytes"
	"context"
	"testing"

	"github.com/cdcout/cdcout/outbox"
)

func TestLines(t *testing.T) {
	var buf bytes.Buffer
	s := New(&buf, nil)
	errs := s.Deliver(context.Background(), []outbox.Record{{ID: "a", Payload: []byte(`{"id":"a"}`)}, {ID: "b", Payload: []byte(`{"id":"b"}`)}})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got, want := buf.String(), "{\"id\":\"a\"}\n{\"id\":\"b\"}\n"; got != want {
		t.Errorf("output = %q, want %q", got, want)
	}
}
