package binlog

import (
	"context"
	"fmt"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// What a replay's re-read of older changes (engine/replay_binlog.go)
// needs beside Run: where the log ends now, and where a time lies.

// End is the server's current end of the binary log, file and position.
func (s *Stream) End(ctx context.Context) (file string, pos uint32, err error) {
	return masterStatus(ctx, s.db)
}

// OldestBinlog is the oldest binary log the server still has.
func (s *Stream) OldestBinlog(ctx context.Context) (string, error) {
	files, err := binlogFiles(ctx, s.db)
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("list the binary logs: %v", err)
	}
	return files[0], nil
}

// FileAt finds where to read from for the changes committed at or after
// t: the newest binlog file whose first event (its format description,
// written when the file was opened) is not after t, as "file:4". Every
// event before that file's start is older than t, so nothing at or after
// t lies in an earlier file. When even the oldest file the server still
// has begins after t, what was committed between t and then may have been
// in purged files: the error says so and names the oldest file, wrapping
// ErrPositionUnavailable.
//
// It reads each file's first events over a replication connection of the
// Stream's server id, newest file first, so it is one short read per file
// back from the end to the one that holds t.
func (s *Stream) FileAt(ctx context.Context, t time.Time) (string, error) {
	files, err := binlogFiles(ctx, s.db)
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("the server lists no binary logs: is the binary log on?")
	}
	for i := len(files) - 1; i >= 0; i-- {
		opened, err := s.firstEventTime(ctx, files[i])
		if err != nil {
			return "", err
		}
		// The header's time is in whole seconds: the file was opened
		// before t only if a second later is not after t.
		if !opened.Add(time.Second).After(t) {
			return files[i] + ":4", nil
		}
	}
	return "", fmt.Errorf("the server's oldest binary log %s begins at %s, after %s: changes between may have been in purged binlogs (oldest available: %s): %w",
		files[0], s.firstTimeText(ctx, files[0]), t.UTC().Format(time.RFC3339Nano), files[0], ErrPositionUnavailable)
}

func (s *Stream) firstTimeText(ctx context.Context, file string) string {
	t, err := s.firstEventTime(ctx, file)
	if err != nil {
		return "an unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}

// firstEventTime is the time of file's first real event (the rotate event
// a dump starts with carries none).
func (s *Stream) firstEventTime(ctx context.Context, file string) (time.Time, error) {
	scfg, err := s.syncerConfig()
	if err != nil {
		return time.Time{}, err
	}
	scfg.RowsEventDecodeFunc = nil
	syncer := replication.NewBinlogSyncer(scfg)
	defer syncer.Close()
	streamer, err := syncer.StartSync(gomysql.Position{Name: file, Pos: 4})
	if err != nil {
		return time.Time{}, fmt.Errorf("read the start of binlog %s: %w", file, err)
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	defer cancel()
	for {
		ev, err := streamer.GetEvent(rctx)
		if err != nil {
			return time.Time{}, fmt.Errorf("read the start of binlog %s: %w", file, err)
		}
		if ev.Header.Timestamp != 0 {
			return time.Unix(int64(ev.Header.Timestamp), 0), nil
		}
	}
}
