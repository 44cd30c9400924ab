package binlog

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cdcout/cdcout/canonical"
)

func pipelineChange(row int, op canonical.Op) Event {
	return Event{Change: &canonical.Change{Op: op, Source: canonical.Source{Row: row}}}
}

// TestPipelineOrderAndHandOver: the handler sees every event in stream
// order; a commit and a schema change are handed over at once, while rows
// wait for one of them (or a full batch).
func TestPipelineOrderAndHandOver(t *testing.T) {
	got := make(chan Event, 1024)
	p := NewPipeline(func(ev Event) error { got <- ev; return nil })
	ctx := context.Background()
	next := func() Event {
		t.Helper()
		select {
		case ev := <-got:
			return ev
		case <-time.After(5 * time.Second):
			t.Fatal("nothing handed over in 5s")
			return Event{}
		}
	}
	for row := range 3 {
		if err := p.Handle(ctx, pipelineChange(row, canonical.OpCreate)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if len(got) != 0 {
		t.Fatalf("%d rows handed over before their commit", len(got))
	}
	if err := p.Handle(ctx, Event{Commit: &Commit{}}); err != nil {
		t.Fatal(err)
	}
	for row := range 3 {
		if ev := next(); ev.Change == nil || ev.Change.Source.Row != row {
			t.Fatalf("event %d: %+v", row, ev)
		}
	}
	if ev := next(); ev.Commit == nil {
		t.Fatalf("want the commit, got %+v", ev)
	}
	if err := p.Handle(ctx, pipelineChange(9, canonical.OpDDL)); err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev.Change == nil || ev.Change.Op != canonical.OpDDL {
		t.Fatalf("want the schema change, got %+v", ev)
	}
	// More rows than a batch holds go without a commit; Close hands over
	// the rest.
	for row := range pipelineEvents + 5 {
		if err := p.Handle(ctx, pipelineChange(row, canonical.OpUpdate)); err != nil {
			t.Fatal(err)
		}
	}
	for row := range pipelineEvents {
		if ev := next(); ev.Change.Source.Row != row {
			t.Fatalf("full batch, event %d: row %d", row, ev.Change.Source.Row)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 {
		t.Fatalf("Close handed over %d of the 5 rows left", len(got))
	}
}

// TestPipelineError: the handler's first error comes back from the next
// Handle and from Close, and nothing after it is handled.
func TestPipelineError(t *testing.T) {
	boom := errors.New("disk full")
	handled := 0
	p := NewPipeline(func(ev Event) error {
		handled++
		if handled == 2 {
			return boom
		}
		return nil
	})
	ctx := context.Background()
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for row := 0; err == nil && time.Now().Before(deadline); row++ {
		if err = p.Handle(ctx, pipelineChange(row, canonical.OpCreate)); err == nil {
			err = p.Handle(ctx, Event{Commit: &Commit{}})
		}
	}
	if !errors.Is(err, boom) {
		t.Fatalf("Handle: %v, want the handler's error", err)
	}
	if err := p.Close(); !errors.Is(err, boom) {
		t.Fatalf("Close: %v, want the handler's error", err)
	}
	if handled != 2 {
		t.Fatalf("handled %d events, want 2: none after the error", handled)
	}
}

// TestPipelineBackpressure: a handler that does not keep up holds Handle
// once pipelineQueued batches wait, and ctx ends the wait.
func TestPipelineBackpressure(t *testing.T) {
	release := make(chan struct{})
	p := NewPipeline(func(Event) error { <-release; return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var err error
	commits := 0
	for ; err == nil && commits < 100; commits++ {
		err = p.Handle(ctx, Event{Commit: &Commit{}})
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Handle: %v after %d commits, want the context's deadline", err, commits)
	}
	// One batch in the handler, pipelineQueued waiting, the last refused.
	if want := pipelineQueued + 2; commits != want {
		t.Fatalf("Handle waited at commit %d, want %d", commits, want)
	}
	close(release)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestPipelineLargeRow: a change whose row images reach pipelineBytes is
// handed over at once, without waiting for its commit.
func TestPipelineLargeRow(t *testing.T) {
	got := make(chan Event, 4)
	p := NewPipeline(func(ev Event) error { got <- ev; return nil })
	big := pipelineChange(1, canonical.OpCreate)
	big.Change.After = canonical.Row{"data": make([]byte, pipelineBytes)}
	if err := p.Handle(context.Background(), big); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-got:
		if ev.Change != big.Change {
			t.Fatalf("handed over %+v, want the large row", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a row of pipelineBytes waited for its commit")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
