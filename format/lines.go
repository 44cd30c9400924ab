package format

import (
	"context"
	"fmt"
	"sync"

	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
)

// Lines is a batch of records encoded as JSON lines for one write: the
// buffer and the indexes of the records it holds. Release returns the
// buffer for the next batch once it is written.
type Lines struct {
	Buf     []byte
	Written []int
}

// lineBuffers hold released Lines buffers: a new one per batch, the size
// of a segment's payloads, was a twelfth of what a durable run to a file
// allocated on realistic rows (BenchmarkFileEndToEnd, CDCOUT_MEMPROFILE).
// One grown past maxPooledLines is not kept.
var lineBuffers sync.Pool

const maxPooledLines = 4 << 20

// Release hands l's buffer back for a later EncodeLines: the caller has
// written it and keeps no reference to it. Buf is nil afterwards; Written
// stays, for Fail.
func (l *Lines) Release() {
	if b := l.Buf; cap(b) > 0 && cap(b) <= maxPooledLines {
		lineBuffers.Put(&b)
	}
	l.Buf = nil
}

// EncodeLines encodes recs in f, one line each, for the sinks that write
// lines (file, stdout). A record that cannot be encoded gets a permanent
// error in errs (no retry changes its stored payload) and is left out.
// ok is false when there is nothing to write: no record could be encoded,
// or ctx ended (the encoded records then get ctx's error).
func EncodeLines(ctx context.Context, f Format, recs []outbox.Record, errs []error) (l Lines, ok bool) {
	// Sized for the stored payloads: exact for native, close for the
	// formats whose line is built from them; growing from empty copied the
	// buffer a dozen times per batch.
	n := 0
	for _, rec := range recs {
		n += len(rec.Payload) + 1
	}
	l = Lines{Written: make([]int, 0, len(recs))}
	if b, _ := lineBuffers.Get().(*[]byte); b != nil && cap(*b) >= n {
		l.Buf = (*b)[:0]
	} else {
		l.Buf = make([]byte, 0, n)
	}
	for i, rec := range recs {
		body, err := f.Encode(rec)
		if err != nil {
			errs[i] = sink.Permanent(fmt.Errorf("encode %s: %w", rec.ID, err))
			continue
		}
		l.Buf = append(l.Buf, body...)
		l.Buf = append(l.Buf, '\n')
		l.Written = append(l.Written, i)
	}
	if len(l.Written) == 0 {
		return l, false
	}
	if err := ctx.Err(); err != nil {
		l.Fail(errs, err)
		return l, false
	}
	return l, true
}

// Fail gives err to every record the lines hold and returns errs.
func (l Lines) Fail(errs []error, err error) []error {
	for _, i := range l.Written {
		errs[i] = err
	}
	return errs
}
