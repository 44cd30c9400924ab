package engine

import (
	"context"
	"sync"
)

// group owns the long-running services of one Run (inspect server, drain
// leases, heartbeat, janitor): each runs in a goroutine of its own with a
// context of its own, and stop ends them in the reverse order of their
// start, waiting for each before the next, so a service never outlives
// one started before it (the inspect server answers /readyz until every
// other service is down). Stop steps that are not goroutines (cancelling
// the drainers, a release) take their place in the same order through
// onStop.
type group struct {
	wg    sync.WaitGroup
	stops []func()
}

// run starts fn in a goroutine with a context derived from parent that
// stop cancels; after, when set, runs once fn has returned.
func (g *group) run(parent context.Context, fn func(ctx context.Context), after func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer close(done)
		fn(ctx)
	}()
	g.onStop(func() {
		cancel()
		<-done
		if after != nil {
			after()
		}
	})
}

// onStop adds a step to the stop sequence at this point of the start order.
func (g *group) onStop(f func()) { g.stops = append(g.stops, f) }

// stop runs the stop steps, the last added first, and waits for every
// goroutine the group started. It may be called more than once.
func (g *group) stop() {
	for i := len(g.stops) - 1; i >= 0; i-- {
		g.stops[i]()
	}
	g.stops = nil
	g.wg.Wait()
}
