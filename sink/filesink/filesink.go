// Package filesink appends records as JSON lines to a local file
// (file:///path/out.jsonl) and fsyncs once per Deliver call, so a record
// reported delivered is on disk.
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
	mu     sync.Mutex
	f      *os.File
	path   string
	format format.Format
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

// Deliver appends the records' lines in one write and fsyncs.
func (s *Sink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	lines, ok := format.EncodeLines(ctx, s.format, recs, errs)
	if !ok {
		return errs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return lines.Fail(errs, errors.New("file sink closed"))
	}
	if _, err := s.f.Write(lines.Buf); err != nil {
		return lines.Fail(errs, fmt.Errorf("append %s: %w", s.path, err))
	}
	if err := s.f.Sync(); err != nil {
		return lines.Fail(errs, fmt.Errorf("fsync %s: %w", s.path, err))
	}
	return errs
}

// Close closes the file.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}
