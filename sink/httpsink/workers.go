package httpsink

import (
	"sync"
	"time"
)

// workers runs the requests of Deliver calls on goroutines that outlive a
// call. A goroutine started per request (one POST per record, hundreds
// waiting for the endpoint's limit at once) grew its stack on the way
// into the transport, copying it twice, and was torn down after one
// request: a twentieth of cdcout's CPU end to end. A worker that finished
// a request waits for the next one for workerIdle, then exits; Close ends
// the waiting ones. A request finds a waiting worker or starts one, so
// requests never queue for a worker: each still waits for its slot of the
// endpoint's limit on its own, in the order the calls handed them over.
type workers struct {
	work chan func() // unbuffered: a send succeeds only to a waiting worker
	quit chan struct{}
	wg   sync.WaitGroup

	mu     sync.Mutex
	closed bool
	n      int // workers alive
}

// workerIdle is how long a worker waits for the next request.
const workerIdle = 10 * time.Second

func newWorkers() *workers {
	return &workers{work: make(chan func()), quit: make(chan struct{})}
}

// run runs f on a waiting worker, or on a new one.
func (w *workers) run(f func()) {
	select {
	case w.work <- f:
		return
	default:
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		go f() // after Close: the call still completes
		return
	}
	w.wg.Add(1)
	w.n++
	w.mu.Unlock()
	go w.loop(f)
}

func (w *workers) loop(f func()) {
	defer func() {
		w.mu.Lock()
		w.n--
		w.mu.Unlock()
		w.wg.Done()
	}()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		f()
		idle.Reset(workerIdle)
		select {
		case f = <-w.work:
		case <-idle.C:
			return
		case <-w.quit:
			return
		}
	}
}

// alive is the number of workers.
func (w *workers) alive() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// close ends the waiting workers and waits for those still running a
// request.
func (w *workers) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.quit)
	}
	w.mu.Unlock()
	w.wg.Wait()
}
