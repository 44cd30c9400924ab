// Package stdoutsink writes records as JSON lines to an io.Writer (the
// process's standard output), one line per record.
//
// It is the sink for trying cdcout out and for piping into other tools. A
// Deliver call's lines go out in one Write so that lines of concurrent
// callers never interleave mid-line.
package stdoutsink

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/outbox"
)

// Sink writes JSON lines to a writer.
type Sink struct {
	mu     sync.Mutex
	w      io.Writer
	format format.Format
}

var _ outbox.Sink = (*Sink)(nil)

// New returns a sink writing to w in format f (nil means the stored
// envelope, i.e. debezium).
func New(w io.Writer, f format.Format) *Sink {
	if f == nil {
		f, _ = format.New(format.Debezium)
	}
	return &Sink{w: w, format: f}
}

// Deliver writes each record's encoded body followed by a newline.
func (s *Sink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	lines, ok := format.EncodeLines(ctx, s.format, recs, errs)
	if !ok {
		return errs
	}
	s.mu.Lock()
	_, err := s.w.Write(lines.Buf)
	s.mu.Unlock()
	lines.Release()
	if err != nil {
		return lines.Fail(errs, fmt.Errorf("write: %w", err))
	}
	return errs
}
