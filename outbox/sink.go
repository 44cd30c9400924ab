package outbox

import (
	"context"
	"time"

	"github.com/cdcout/cdcout/canonical"
)

// Record is one outbox row as a sink sees it.
type Record struct {
	// ID is the row's UUIDv7 id: the deliveryKey, stable across retries and
	// replicas, so consumers and brokers can drop redeliveries.
	ID    string
	Pipe  string // "<instance>:<db.table>:<sink>"
	Sink  string
	DB    string
	Table string
	Op    canonical.Op
	// Key is the canonical JSON of the row key ("null" for a keyless table).
	// Records of one key are delivered in commit order.
	Key string
	// Payload is the canonical envelope JSON with "id" = ID added.
	Payload []byte
	// Attempt counts from 1.
	Attempt int
	// CommitTime is the source commit time of the change.
	CommitTime time.Time
}

// Sink delivers records to one destination.
//
// The drainer never puts two records of the same Key into one call, so a
// sink may send a call's records concurrently; per-key order comes from the
// drainer not handing out a key's next record before the previous one is
// delivered. Deliver returns one error per record, nil where delivered. A
// sink.Permanent error dead-letters that record; any other error is retried
// with backoff (sink.RetryAfter overrides the delay). ctx ends when the
// attempt's timeout passes, and the sink must give up then.
type Sink interface {
	Deliver(ctx context.Context, recs []Record) []error
}

// Paced is implemented by sinks that pace themselves to their receiver
// (sink/httpsink's adaptive concurrency limit): they bound each request by
// their own timeout once it is sent, and hold records back while the
// receiver is at capacity. The drainer does not give their calls the
// pipe's Timeout (a call of a hundred records to a receiver taking two at
// a time would time out in the queue): a call's context ends when the
// drainer stops or half the claim lease has passed since the claim, and
// the sink answers sink.Overloaded for the records it could not deliver by
// then — they are retried without counting an attempt.
type Paced interface {
	Paced() bool
}
