package engine

import (
	"github.com/cdcout/cdcout/control"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/outbox"
)

// pauseGate wraps the drain lease lookup: a paused sink's pipes
// (control.Watcher) look to the drainers as if their drain lease were not
// held, so they claim nothing and deliveries in flight stop at the next
// key, while the lease itself stays where it is and a resume does not
// reshuffle the pipes over the fleet.
func pauseGate(w *control.Watcher, get func(pipe string) (lease.Lease, bool)) func(pipe string) (lease.Lease, bool) {
	return func(pipe string) (lease.Lease, bool) {
		if _, _, sink, ok := outbox.SplitPipe(pipe); ok && w.IsPaused(sink) {
			return lease.Lease{}, false
		}
		return get(pipe)
	}
}

// wakeSink wakes the drainers of sink's pipes (after a resume, so they
// claim at once rather than at their next idle poll).
func (d *drainers) wakeSink(sink string) {
	d.mu.Lock()
	var wake []*outbox.Drainer
	for pipe, dr := range d.byPipe {
		if _, _, s, ok := outbox.SplitPipe(pipe); ok && s == sink {
			wake = append(wake, dr)
		}
	}
	d.mu.Unlock()
	for _, dr := range wake {
		dr.Wake()
	}
}

// sinkNames are the configured sinks' names.
func (e *Engine) sinkNames() []string {
	out := make([]string, 0, len(e.cfg.Sinks))
	for _, s := range e.cfg.Sinks {
		out = append(out, s.Name)
	}
	return out
}
