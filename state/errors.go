package state

import (
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"reflect"
	"syscall"

	"github.com/go-sql-driver/mysql"
)

// Server error numbers cdcout tells apart (MySQL's and MariaDB's
// ER_* codes; both servers share these numbers).
const (
	ErrnoDBAccessDenied   = 1044 // ER_DBACCESS_DENIED_ERROR
	ErrnoAccessDenied     = 1045 // ER_ACCESS_DENIED_ERROR
	ErrnoBadDB            = 1049 // ER_BAD_DB_ERROR
	ErrnoServerShutdown   = 1053 // ER_SERVER_SHUTDOWN
	ErrnoNormalShutdown   = 1077 // ER_NORMAL_SHUTDOWN
	ErrnoLockDeadlock     = 1213 // ER_LOCK_DEADLOCK
	ErrnoSPDoesNotExist   = 1305 // ER_SP_DOES_NOT_EXIST
	ErrnoConnectionKilled = 1927 // ER_CONNECTION_KILLED (MariaDB)
	// ErrnoClientInteractionTimeout is MySQL 8.0.24+ telling a client
	// that it closed its idle connection (wait_timeout).
	ErrnoClientInteractionTimeout = 4031 // ER_CLIENT_INTERACTION_TIMEOUT
)

// Client error numbers (CR_*): go-sql-driver never reports these as a
// *mysql.MySQLError itself, but a proxy in between may relay them.
const (
	errnoConnectionError = 2002 // CR_CONNECTION_ERROR
	errnoConnHostError   = 2003 // CR_CONN_HOST_ERROR
	errnoServerGone      = 2006 // CR_SERVER_GONE_ERROR
	errnoServerLost      = 2013 // CR_SERVER_LOST
)

// Errno returns the server error number of err, or 0 when err is not a
// server's error.
func Errno(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// Refused reports a server's refusal that no retry fixes: access denied
// or an unknown database. Only a change of configuration (or of grants)
// helps.
func Refused(err error) bool {
	switch Errno(err) {
	case ErrnoDBAccessDenied, ErrnoAccessDenied, ErrnoBadDB:
		return true
	}
	return false
}

// ConnectionLost reports whether err is a database going away — a
// restart, a shutdown, a killed or timed-out session, a network failure —
// rather than a statement the server refused. A retry on a new connection
// may succeed. It decides by the error's type and server error number
// (errors.Is / errors.As), not by its text, with one exception:
// go-sql-driver's unexported errBadConnNoWrite (driverNoWrite).
func ConnectionLost(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne), driverNoWrite(err),
		errors.Is(err, driver.ErrBadConn), errors.Is(err, mysql.ErrInvalidConn),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	switch Errno(err) {
	case ErrnoServerShutdown, ErrnoNormalShutdown, ErrnoConnectionKilled, ErrnoClientInteractionTimeout,
		errnoConnectionError, errnoConnHostError, errnoServerGone, errnoServerLost:
		return true
	}
	return false
}

// driverNoWrite reports go-sql-driver's errBadConnNoWrite in err's chain:
// a write that failed before sending a byte. The driver maps it to
// driver.ErrBadConn on its statement paths, but not on all (a new
// connection whose handshake write fails returns it as is), and then it
// reached the engine as a fatal "read backfill fences: bad connection"
// during a storm of connection resets. It is unexported, so it is known
// by its type (errors.New's) and exact text; TestDriverNoWriteIsLost
// pins it to the driver's own value.
func driverNoWrite(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if reflect.TypeOf(err) == errorsNewType && err.Error() == "bad connection" {
			return true
		}
	}
	return false
}

var errorsNewType = reflect.TypeOf(errors.New(""))
