// Package sinktest holds what the sink packages' tests share: a record of
// a given key and sequence number, a check that a delivery call succeeded
// for every record, and the brokers' test servers (an embedded JetStream,
// a reader of a kfake cluster's topics).
package sinktest

import (
	"fmt"
	"testing"
	"time"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// Record is an insert of key k carrying seq n, in pipe
// "prod:shop.items:<sinkName>"; its payload stands in for an envelope (the
// default format sends payloads as they are).
func Record(sinkName, k string, n int) outbox.Record {
	id := fmt.Sprintf("0192f3a0-0000-7000-8000-%s-%06d", k, n)
	return outbox.Record{
		ID:         id,
		Pipe:       "prod:shop.items:" + sinkName,
		Sink:       sinkName,
		DB:         "shop",
		Table:      "items",
		Op:         canonical.OpCreate,
		Key:        fmt.Sprintf(`{"id":%q}`, k),
		Payload:    fmt.Appendf(nil, `{"id":%q,"key":%q,"seq":%d}`, id, k, n),
		Attempt:    1,
		CommitTime: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
	}
}

// NoErrors fails the test at the first record a Deliver call did not
// deliver.
func NoErrors(tb testing.TB, errs []error) {
	tb.Helper()
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("record %d: %v", i, err)
		}
	}
}
