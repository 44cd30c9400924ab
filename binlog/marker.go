package binlog

import (
	"context"
	"fmt"
	"slices"

	"github.com/cdcout/cdcout/state"
)

// foreignMarked reports whether db holds cdcout's marker table and is not
// one this stream decodes for itself (Config.OwnMarkedDBs): another
// installation's state or watermark database on the same server. Its rows
// are never captured: they are not business data, and their MINIMAL row
// images (state.Open) would otherwise stop the stream.
//
// The answer is read from information_schema as it is now, not as of the
// binlog position: a database marked now was marked before any row was
// written to it (state.CreateMarker runs first). A yes is kept; a no is
// forgotten at every DDL (forgetUnmarked), since the marker's CREATE TABLE
// reaches the binlog before the first row that needs it.
func (s *Stream) foreignMarked(ctx context.Context, db string) (bool, error) {
	if v, ok := s.marked[db]; ok {
		return v, nil
	}
	if slices.Contains(s.cfg.OwnMarkedDBs, db) {
		s.setMarked(db, false)
		return false, nil
	}
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
		db, state.MarkerTable).Scan(&n); err != nil {
		// As a dropped connection: the session resumes at the last commit.
		return false, fmt.Errorf("look up cdcout's marker in %s: %w", db, err)
	}
	s.setMarked(db, n > 0)
	return n > 0, nil
}

func (s *Stream) setMarked(db string, v bool) {
	if s.marked == nil {
		s.marked = map[string]bool{}
	}
	s.marked[db] = v
}

// forgetUnmarked drops the cached noes (a DDL may have created a marker).
func (s *Stream) forgetUnmarked() {
	for db, v := range s.marked {
		if !v && !slices.Contains(s.cfg.OwnMarkedDBs, db) {
			delete(s.marked, db)
		}
	}
}
