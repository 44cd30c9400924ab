package binlog

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestFileAt: a time after the newest binlog was opened is in the newest
// file; a time before a file rotated in (by more than the headers' one
// second) is in an earlier one; a time before the oldest file began may
// be in purged files, refused naming the oldest file.
func TestFileAt(t *testing.T) {
	srv := mysqltest.Shared(t)
	s := openStream(t, testConfig(t, srv))
	ctx := context.Background()
	files := func() []string {
		t.Helper()
		f, err := binlogFiles(ctx, s.db)
		if err != nil || len(f) == 0 {
			t.Fatalf("binlog files %v: %v", f, err)
		}
		return f
	}
	// Two whole seconds on, so the newest file began more than a second
	// before before.
	t0 := time.Now()
	for time.Since(t0) < 2*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	before := time.Now()
	srv.Exec(t, "FLUSH BINARY LOGS")
	all := files()
	got, err := s.FileAt(ctx, before)
	if want := all[len(all)-2] + ":4"; err != nil || got != want {
		t.Errorf("FileAt(before the rotation) = %q, %v; want %s", got, err, want)
	}
	got, err = s.FileAt(ctx, time.Now().Add(2*time.Second))
	if want := all[len(all)-1] + ":4"; err != nil || got != want {
		t.Errorf("FileAt(after the rotation) = %q, %v; want %s", got, err, want)
	}
	_, err = s.FileAt(ctx, time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC))
	if !errors.Is(err, ErrPositionUnavailable) || !strings.Contains(err.Error(), "oldest available: "+all[0]) {
		t.Errorf("FileAt(2000) = %v; want ErrPositionUnavailable naming %s", err, all[0])
	}
}
