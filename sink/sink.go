// Package sink holds what every sink shares: the errors that tell the
// drainer whether a failed delivery is worth retrying. Each external client
// lives in its own subpackage (sink/httpsink, sink/filesink, …).
package sink

import (
	"errors"
	"time"
)

// permanentError marks a failure that no retry can fix (HTTP 400, a record
// too large for the broker): the drainer dead-letters the row at once.
type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() error   { return e.err }
func (e *permanentError) Permanent() bool { return true }

// Permanent wraps err so that IsPermanent reports true.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether any error in err's chain says Permanent().
func IsPermanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}

// retryAfterError carries a server's requested delay (HTTP Retry-After).
type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string             { return e.err.Error() }
func (e *retryAfterError) Unwrap() error             { return e.err }
func (e *retryAfterError) RetryAfter() time.Duration { return e.after }

// RetryAfter wraps a retryable err with the delay the receiver asked for.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{err: err, after: d}
}

// RetryAfterOf returns the delay requested anywhere in err's chain.
func RetryAfterOf(err error) (time.Duration, bool) {
	var r interface{ RetryAfter() time.Duration }
	if errors.As(err, &r) {
		return r.RetryAfter(), true
	}
	return 0, false
}
