package engine

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/binlog"
)

// TestTransient: a lost connection is retried; a purged checkpoint
// position is not, even when the same error also carries a lost
// connection; an error is never classified by its text. The errors real
// servers return are classified in state.TestErrorClassesFromRealServers.
func TestTransient(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("enqueue: %w", mysql.ErrInvalidConn), true},
		{fmt.Errorf("read checkpoint: %w", &mysql.MySQLError{Number: 1053, Message: "Server shutdown in progress"}), true},
		{fmt.Errorf("%w: %w", binlog.ErrPositionUnavailable, io.ErrUnexpectedEOF), false},
		{&mysql.MySQLError{Number: 1064, Message: "syntax error"}, false},
		{errors.New("write: connection reset by peer"), false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
