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
	"github.com/cdcout/cdcout/sink"
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
	buf, written := encodeLines(s.format, recs, errs)
	if len(written) == 0 {
		return errs
	}
	if err := ctx.Err(); err != nil {
		for _, i := range written {
			errs[i] = err
		}
		return errs
	}
	s.mu.Lock()
	_, err := s.w.Write(buf)
	s.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("write: %w", err)
		for _, i := range written {
			errs[i] = err
		}
	}
	return errs
}

// encodeLines encodes recs as JSON lines into one buffer, returning the
// indexes of the records it holds. A record that cannot be encoded gets a
// permanent error: no retry changes its stored payload.
func encodeLines(f format.Format, recs []outbox.Record, errs []error) ([]byte, []int) {
	var buf []byte
	written := make([]int, 0, len(recs))
	for i, rec := range recs {
		body, err := f.Encode(rec)
		if err != nil {
			errs[i] = sink.Permanent(fmt.Errorf("encode %s: %w", rec.ID, err))
			continue
		}
		buf = append(buf, body...)
		buf = append(buf, '\n')
		written = append(written, i)
	}
	return buf, written
}
