package binlog

import (
	"context"
	"sync/atomic"

	"github.com/cdcout/cdcout/canonical"
)

// Pipeline runs an event handler on a goroutine of its own, behind the
// reader: Handle, the Stream's handler, queues events and hands them over
// a batch at a time, so what the handler does to a change (encoding it,
// say) runs beside the reader's decoding of the next ones instead of
// after it. On realistic rows the envelope costs as much as a quarter of
// the reader's work; with it off the reader's goroutine, `cdcout tail`
// reads at the stream's own rate while there is a core to encode on.
//
// A batch goes at every commit and schema change (op "ddl", which no
// commit follows), so nothing waits for a later transaction to be
// handled, and when it holds pipelineEvents events or pipelineBytes of
// row images; at most pipelineQueued batches wait, which bounds the
// memory held to a few MiB besides one oversized row.
//
// The handler sees every event in stream order. Its first error is
// returned by every later Handle and by Close; the events queued after it
// are dropped unhandled, as the Stream would have stopped there.
type Pipeline struct {
	handle func(Event) error
	batch  []Event
	bytes  int // row image bytes in batch
	queue  chan []Event
	free   chan []Event // handled batches, for reuse
	done   chan struct{}
	err    atomic.Pointer[error] // the handler's first
}

// The batch bounds (see Pipeline).
const (
	pipelineEvents = 256
	pipelineBytes  = 1 << 20
	pipelineQueued = 2
)

// NewPipeline starts the goroutine that calls handle. Close ends it.
func NewPipeline(handle func(Event) error) *Pipeline {
	p := &Pipeline{
		handle: handle,
		queue:  make(chan []Event, pipelineQueued),
		free:   make(chan []Event, pipelineQueued+2),
		done:   make(chan struct{}),
	}
	go p.run()
	return p
}

// Handle queues ev; it has Stream.Run's handler signature. It returns the
// handler's error once it has failed, and ctx's when ctx ends while it
// waits for room.
func (p *Pipeline) Handle(ctx context.Context, ev Event) error {
	if err := p.failed(); err != nil {
		return err
	}
	if p.batch == nil {
		select {
		case p.batch = <-p.free:
		default:
			p.batch = make([]Event, 0, pipelineEvents)
		}
	}
	p.batch = append(p.batch, ev)
	if ch := ev.Change; ch != nil && ev.Commit == nil {
		p.bytes += ch.ImageBytes()
		if ch.Op != canonical.OpDDL && len(p.batch) < pipelineEvents && p.bytes < pipelineBytes {
			return nil
		}
	}
	return p.send(ctx)
}

func (p *Pipeline) send(ctx context.Context) error {
	select {
	case p.queue <- p.batch:
		p.batch, p.bytes = nil, 0
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close hands over what is queued, waits until it is handled and returns
// the handler's first error. Call it once, after the Stream's Run.
func (p *Pipeline) Close() error {
	if len(p.batch) > 0 {
		p.queue <- p.batch
		p.batch = nil
	}
	close(p.queue)
	<-p.done
	return p.failed()
}

func (p *Pipeline) run() {
	defer close(p.done)
	for batch := range p.queue {
		if p.failed() == nil {
			for _, ev := range batch {
				if err := p.handle(ev); err != nil {
					p.err.Store(&err)
					break
				}
			}
		}
		// The events are the handler's now: keep none alive here.
		clear(batch)
		select {
		case p.free <- batch[:0]:
		default:
		}
	}
}

func (p *Pipeline) failed() error {
	if err := p.err.Load(); err != nil {
		return *err
	}
	return nil
}
