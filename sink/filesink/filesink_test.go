package filesink

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/cdcout/cdcout/outbox"
)

func TestAppendAndTornLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	if got, err := PathOf("file://" + path); err != nil || got != path {
		t.Fatalf("PathOf = %q, %v", got, err)
	}
	if _, err := PathOf("file://relative.jsonl"); err == nil {
		t.Error("PathOf accepted a host-relative URL")
	}
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	errs := s.Deliver(context.Background(), []outbox.Record{{ID: "a", Payload: []byte(`{"id":"a"}`)}, {ID: "b", Payload: []byte(`{"id":"b"}`)}})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	// A crash mid-write leaves a torn line; reopening must not glue the
	// next record onto it.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"id":"tor`)
	f.Close()
	s, err = Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Deliver(context.Background(), []outbox.Record{{ID: "c", Payload: []byte(`{"id":"c"}`)}})[0]; err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if got, want := string(b), "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"tor\n{\"id\":\"c\"}\n"; got != want {
		t.Errorf("file = %q, want %q", got, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Deliver(ctx, []outbox.Record{{ID: "d", Payload: []byte(`{}`)}})[0]; err == nil {
		t.Error("Deliver with a done context succeeded")
	}
}
