package outbox

import (
	"context"
	"strings"

	"github.com/cdcout/cdcout/state"
)

// Status is the status column of an outbox row or a segment. A row is
// pending (claimed or not: a claim is a claimer and a next attempt in the
// future, see release.go), delivered or dead; a segment is pending or
// done.
type Status string

// The statuses.
const (
	StatusPending   Status = "pending"
	StatusDelivered Status = "delivered"
	StatusDead      Status = "dead"
	// StatusDone is a segment whose records are all delivered or left it
	// as outbox rows.
	StatusDone Status = "done"
)

// PipesWithRecords lists the pipes named prefix… ("" for every pipe) that
// have outbox rows or segments, of status only when status is not "".
// Each side is a loose scan of the first column of its table's (pipe,
// status, …) index, one probe per pipe.
func (s *Store) PipesWithRecords(ctx context.Context, prefix string, status Status) ([]string, error) {
	var (
		where []string
		args  []any
	)
	if prefix != "" {
		where, args = append(where, "pipe LIKE ?"), append(args, state.LikePrefix(prefix))
	}
	if status != "" {
		where, args = append(where, "status = ?"), append(args, string(status))
	}
	cond := ""
	if len(where) > 0 {
		cond = " WHERE " + strings.Join(where, " AND ")
	}
	return state.Strings(ctx, s.db, `SELECT DISTINCT pipe FROM `+s.outbox+cond+
		` UNION SELECT DISTINCT pipe FROM `+s.segments+cond, append(args, args...)...)
}
