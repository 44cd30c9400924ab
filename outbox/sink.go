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
