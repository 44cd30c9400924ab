package state

import (
	"context"
	"database/sql"
	"fmt"
)

// MarkerTable is created, empty, in every database cdcout keeps state in
// (the state database and the watermark database on the source). A stream
// never captures a database holding it, whoever's it is: another
// installation's state on the same server is written with MINIMAL row
// images by design (Open) and its rows are nobody's business data. The
// marker, not a configured name, is what tells them apart, since one
// installation cannot know the names the others were given.
const MarkerTable = "cdcout_marker"

// Execer is what CreateMarker needs of a connection.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// CreateMarker creates the marker table in db. It must run before any row
// is written to db, so a stream reading those rows finds the marker.
func CreateMarker(ctx context.Context, ex Execer, db string) error {
	if _, err := ex.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+Table(db, MarkerTable)+
		" (kind VARCHAR(16) NOT NULL PRIMARY KEY) ENGINE=InnoDB COMMENT='cdcout state: never captured by cdcout'"); err != nil {
		return fmt.Errorf("create marker table %s.%s: %w", db, MarkerTable, err)
	}
	return nil
}
