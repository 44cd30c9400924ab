package filesink

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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

// Concurrent calls share fsyncs, and every record of every call reported
// delivered is in the file once.
func TestConcurrentDeliversShareFsyncs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.jsonl")
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	const callers, calls = 8, 40
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				id := fmt.Sprintf("%d-%d", c, i)
				if err := s.Deliver(context.Background(), []outbox.Record{{ID: id, Payload: []byte(`{"id":"` + id + `"}`)}})[0]; err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	syncs := s.syncs
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		seen[l] = true
	}
	if len(lines) != callers*calls || len(seen) != callers*calls {
		t.Fatalf("%d lines, %d distinct, want %d", len(lines), len(seen), callers*calls)
	}
	if syncs < 1 || syncs > callers*calls {
		t.Fatalf("%d fsyncs for %d calls", syncs, callers*calls)
	}
	t.Logf("%d calls from %d callers, %d fsyncs", callers*calls, callers, syncs)
	if err := s.Deliver(context.Background(), []outbox.Record{{ID: "late", Payload: []byte(`{}`)}})[0]; err == nil {
		t.Fatal("Deliver after Close succeeded")
	}
}

// Writes made while an fsync is under way are covered by the next one
// fsync, not one each.
func TestWritesDuringAnFsyncShareTheNext(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "out.jsonl"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.syncMu.Lock() // an fsync under way
	const callers = 8
	errs := make(chan error, callers)
	for c := range callers {
		go func() {
			errs <- s.Deliver(context.Background(), []outbox.Record{{ID: fmt.Sprint(c), Payload: []byte(`{}`)}})[0]
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		n := s.written
		s.mu.Unlock()
		if n == callers {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d writes made", n, callers)
		}
	}
	s.syncMu.Unlock()
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if s.syncs != 1 {
		t.Fatalf("%d fsyncs for %d writes made during one, want 1", s.syncs, callers)
	}
}
