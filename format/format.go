// Package format turns an outbox record into the bytes a sink sends: the
// Debezium-style envelope as stored (the default), a structured-mode
// CloudEvent wrapping it, or a Maxwell-style row document. Every output is
// canonical JSON (sorted keys, no whitespace), so the same record encodes to
// the same bytes on every replica and every retry.
package format

import (
	"fmt"
	"strings"
	"time"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/outbox"
)

// Format encodes one record for the wire.
type Format interface {
	// Encode returns the record's message body. An error means the stored
	// payload cannot be encoded; no retry can fix that.
	Encode(rec outbox.Record) ([]byte, error)
	// ContentType is the MIME type of Encode's output, for transports
	// with a content-type header.
	ContentType() string
}

// The format names accepted by New (the sinks' `format:` option).
const (
	Debezium    = "debezium"
	CloudEvents = "cloudevents"
	Maxwell     = "maxwell"
	// Native is the stored envelope as is, for every record: the same as
	// debezium except for schema-change records.
	Native = "native"
)

// Names lists the accepted format names, for config validation messages.
var Names = []string{Debezium, CloudEvents, Maxwell, Native}

// New returns the format called name; "" means debezium.
func New(name string) (Format, error) {
	switch name {
	case "", Debezium:
		return debeziumFormat{}, nil
	case CloudEvents:
		return cloudEventsFormat{}, nil
	case Maxwell:
		return maxwellFormat{}, nil
	case Native:
		return nativeFormat{}, nil
	default:
		return nil, fmt.Errorf("unknown format %q (want one of %s)", name, strings.Join(Names, ", "))
	}
}

// marshal is the one place the wrappers are serialised, so that they use
// the same canonical encoder as the envelopes they embed.
var marshal = canonical.Marshal

// nativeFormat sends the stored envelope untouched, schema-change records
// included (op "ddl" with the "ddl" object, docs/formats.md).
type nativeFormat struct{}

func (nativeFormat) Encode(rec outbox.Record) ([]byte, error) { return rec.Payload, nil }
func (nativeFormat) ContentType() string                      { return "application/json" }

// Instance returns the cdcout instance a record belongs to: the first
// segment of its pipe ("<instance>:<db.table>:<sink>").
func Instance(rec outbox.Record) string {
	return outbox.PipeInstance(rec.Pipe)
}

// CloudEvents attributes shared by the cloudevents format and the sinks'
// ce_* / ce-* headers, so a consumer sees the same values either way.

// CESpecVersion is the CloudEvents version cdcout emits.
const CESpecVersion = "1.0"

// CEType is the CloudEvents type of a record: "cdcout.change.<op>" with op
// the envelope's op letter (c, u, d, r); "cdcout.heartbeat" for a
// heartbeat, "cdcout.transaction" for a transaction's BEGIN or END and
// "cdcout.ddl" for a schema change, which are no row changes.
func CEType(rec outbox.Record) string {
	var b [32]byte
	return string(AppendCEType(b[:0], rec))
}

// AppendCEType appends CEType(rec) to dst, for headers built in one buffer.
func AppendCEType(dst []byte, rec outbox.Record) []byte {
	switch rec.Op {
	case canonical.OpHeartbeat:
		return append(dst, "cdcout.heartbeat"...)
	case canonical.OpTransaction:
		return append(dst, "cdcout.transaction"...)
	case canonical.OpDDL:
		return append(dst, "cdcout.ddl"...)
	}
	return append(append(dst, "cdcout.change."...), rec.Op...)
}

// CESource is the CloudEvents source of a record: "cdcout/<instance>".
func CESource(rec outbox.Record) string { return "cdcout/" + Instance(rec) }

// AppendCESource appends CESource(rec) to dst.
func AppendCESource(dst []byte, rec outbox.Record) []byte {
	return append(append(dst, "cdcout/"...), Instance(rec)...)
}

// CESubject is the CloudEvents subject of a record: "<db>.<table>".
func CESubject(rec outbox.Record) string { return rec.DB + "." + rec.Table }

// AppendCESubject appends CESubject(rec) to dst.
func AppendCESubject(dst []byte, rec outbox.Record) []byte {
	return append(append(append(dst, rec.DB...), '.'), rec.Table...)
}

// CETime is the record's commit time as RFC 3339 in UTC, "" when unknown.
func CETime(rec outbox.Record) string {
	if rec.CommitTime.IsZero() {
		return ""
	}
	return rec.CommitTime.UTC().Format(time.RFC3339Nano)
}

// AppendCETime appends CETime(rec) to dst (nothing when unknown).
func AppendCETime(dst []byte, rec outbox.Record) []byte {
	if rec.CommitTime.IsZero() {
		return dst
	}
	return rec.CommitTime.UTC().AppendFormat(dst, time.RFC3339Nano)
}
