// Package filesink appends records as JSON lines to a local file
// (file:///path/out.jsonl) and reports them delivered only once an fsync
// that began after their write returned, so a record reported delivered
// is on disk. Concurrent Deliver calls share fsyncs (group commit): the
// drainer makes up to `concurrency` calls at once, and one fsync each,
// taken in turn under the file's lock, made the disk's sync latency the
// sink's ceiling.
//
// A crash between write and fsync can leave a partial last line; Open
// terminates it with a newline so later lines stay parseable (the partial
// record is redelivered, since it was never reported delivered).
package filesink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sync"

	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/outbox"
)

// Sink appends JSON lines to a file.
type Sink struct {
	// syncMu is held by the one fsync under way (and by Close); it is
	// taken before mu, never while holding it.
	syncMu sync.Mutex
	mu     sync.Mutex // f and the generations below
	f      *os.File
	path   string
	format format.Format
	// Writes are numbered: written is the last write's generation, synced
	// the last one known on disk. failedTo and syncErr: an fsync failed
	// for the writes up to that generation (a later fsync's success says
	// nothing about them, Linux may have dropped the pages).
	written, synced, failedTo uint64
	syncErr                   error
	syncs                     int // fsyncs made, for tests
}

var _ outbox.Sink = (*Sink)(nil)

// PathOf returns the file path of a file:///path URL.
func PathOf(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("parse file url: %w", err)
	}
	if u.Scheme != "file" || u.Path == "" || (u.Host != "" && u.Host != "localhost") {
		return "", fmt.Errorf("file url %q: want file:///absolute/path", rawURL)
	}
	return u.Path, nil
}

// Open opens (creating if needed) the file at path for appending, in format
// f (nil means debezium).
func Open(path string, f format.Format) (*Sink, error) {
	if f == nil {
		f, _ = format.New(format.Debezium)
	}
	file, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open file sink: %w", err)
	}
	if err := terminateLastLine(file); err != nil {
		file.Close()
		return nil, fmt.Errorf("open file sink %s: %w", path, err)
	}
	return &Sink{f: file, path: path, format: f}, nil
}

func terminateLastLine(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() == 0 {
		return nil
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, st.Size()-1); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if last[0] == '\n' {
		return nil
	}
	if _, err := f.Write([]byte{'\n'}); err != nil {
		return err
	}
	return f.Sync()
}

// Deliver appends the records' lines in one write and returns once an
// fsync covers it (see sync).
func (s *Sink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	lines, ok := format.EncodeLines(ctx, s.format, recs, errs)
	if !ok {
		return errs
	}
	s.mu.Lock()
	if s.f == nil {
		s.mu.Unlock()
		return lines.Fail(errs, errors.New("file sink closed"))
	}
	_, err := s.f.Write(lines.Buf)
	if err != nil {
		s.mu.Unlock()
		return lines.Fail(errs, fmt.Errorf("append %s: %w", s.path, err))
	}
	s.written++
	gen := s.written
	s.mu.Unlock()
	lines.Release()
	if err := s.sync(gen); err != nil {
		return lines.Fail(errs, err)
	}
	return errs
}

// sync returns once the write of generation gen is on disk: covered by an
// fsync that began after it, this call's or a concurrent one's.
func (s *Sink) sync(gen uint64) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	f, upTo := s.f, s.written
	switch {
	case gen <= s.failedTo:
		err := s.syncErr
		s.mu.Unlock()
		return err
	case gen <= s.synced:
		s.mu.Unlock()
		return nil
	case f == nil:
		s.mu.Unlock()
		return errors.New("file sink closed")
	}
	s.mu.Unlock()
	err := f.Sync()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.syncs++
	if err != nil {
		s.failedTo, s.syncErr = upTo, fmt.Errorf("fsync %s: %w", s.path, err)
		return s.syncErr
	}
	s.synced = upTo
	return nil
}

// Close closes the file.
func (s *Sink) Close() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}
