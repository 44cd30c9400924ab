package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
)

func TestGroupStopsInReverseOrderAndWaits(t *testing.T) {
	var (
		g     group
		mu    sync.Mutex
		order []string
	)
	note := func(s string) {
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
	}
	service := func(name string) func(context.Context) {
		return func(ctx context.Context) {
			<-ctx.Done()
			note(name + " returned")
		}
	}
	g.run(context.Background(), service("inspect"), func() { note("inspect after") })
	g.onStop(func() { note("drainers cancelled") })
	g.run(context.Background(), service("leases"), nil)
	g.run(context.Background(), service("janitor"), nil)
	g.stop()
	want := []string{"janitor returned", "leases returned", "drainers cancelled", "inspect returned", "inspect after"}
	if !slices.Equal(order, want) {
		t.Fatalf("stop order %q, want %q", order, want)
	}
	g.stop() // a second stop is a no-op
	if len(order) != len(want) {
		t.Fatalf("second stop ran steps again: %q", order)
	}
}

func TestGroupServiceEndsWithParent(t *testing.T) {
	var g group
	parent, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	g.run(parent, func(ctx context.Context) { <-ctx.Done(); close(ended) }, nil)
	cancel()
	<-ended // the service's context derives from parent
	g.stop()
}
