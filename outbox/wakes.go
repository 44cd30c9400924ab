package outbox

import "sync"

// Wakes wakes, within one process, a pipe whose oldest segment waits for
// another pipe of the same sink (oldestSegment, fenceWait) as soon as that
// pipe's records are acknowledged (delivered or dead), instead of at its
// next poll (barrierPoll). In a sink with transactions changes wait for
// the BEGINs and ENDs for the changes, so each enqueue's records take
// three steps; at one poll per step the sink would lag 150 ms a batch.
// The engine runs one Drainer per pipe and shares one Wakes among them;
// the poll stays for the pipes drained by other replicas.
//
// Only pipes marked waiting are woken, so a sink without waits costs a
// lock and a look at its pipes per recorded batch, and no query.
type Wakes struct {
	mu     sync.Mutex
	bySink map[string][]*pipeDrainer // instance:sink → running pipes
}

// NewWakes returns an empty Wakes.
func NewWakes() *Wakes { return &Wakes{bySink: map[string][]*pipeDrainer{}} }

// wakeKey is the instance and sink of a pipe: the pipes that wait for
// each other.
func wakeKey(pipe string) string {
	instance, _, sink, _ := SplitPipe(pipe)
	return instance + ":" + sink
}

func (w *Wakes) add(p *pipeDrainer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := wakeKey(p.name)
	w.bySink[k] = append(w.bySink[k], p)
}

func (w *Wakes) remove(p *pipeDrainer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := wakeKey(p.name)
	pipes := w.bySink[k]
	for i, q := range pipes {
		if q == p {
			pipes = append(pipes[:i:i], pipes[i+1:]...)
			break
		}
	}
	if len(pipes) == 0 {
		delete(w.bySink, k)
		return
	}
	w.bySink[k] = pipes
}

// settled wakes the waiting pipes of p's sink: records of p were
// acknowledged. A pipe marks itself waiting before it reads what it waits
// for, and p's outcome is committed before this is called, so a wait
// either read the outcome or gets the wake-up.
func (w *Wakes) settled(p *pipeDrainer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, q := range w.bySink[wakeKey(p.name)] {
		if q != p && q.waiting.Load() {
			q.pokeSegments()
		}
	}
}
