package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/klauspost/compress/s2"

	"github.com/cdcout/cdcout/canonical"
)

// A segment holds one enqueue transaction's records of one pipe, in commit
// order, in one row of the segments table (migration 3 says why). Its
// payload is a sequence of records, each a run of length-prefixed fields:
//
//	version byte (1), then per record:
//	uvarint len + id, change_key, db, tbl, op, row_key, key_hash
//	varint commit time (µs since the epoch)
//	uvarint len + envelope
//
// The envelope is the record's canonical JSON with "id" added, the bytes a
// sink sends; the other fields are what an outbox row of the record holds,
// so a record that leaves its segment becomes that row unchanged.
const segmentVersion = 1

// segmentS2 marks a payload that is the version 1 form compressed with S2
// (github.com/klauspost/compress/s2). Envelopes are JSON with much
// repetition (column names, change-key prefixes), so a segment shrinks
// about threefold, and with it the bytes the database writes twice (table
// and binary log) and sends to every binlog reader.
const segmentS2 = 2

// Segment bounds: a segment holds at most this many records and payload
// bytes, so it fits in one statement far below max_allowed_packet.
const (
	maxSegmentRecords = 1000
	maxSegmentBytes   = maxBytesPerStatement
)

// segRecord is one record of a segment.
type segRecord struct {
	id, changeKey, db, tbl, op, rowKey, keyHash string
	commitTS                                    time.Time
	payload                                     []byte
}

func (r *segRecord) size() int {
	return len(r.id) + len(r.changeKey) + len(r.db) + len(r.tbl) + len(r.op) + len(r.rowKey) + len(r.keyHash) + len(r.payload) + 8*binary.MaxVarintLen64
}

// Record is the record as the drainer hands it to a sink.
func (r *segRecord) record(pipe, sink string, attempt int) Record {
	return Record{ID: r.id, Pipe: pipe, Sink: sink, DB: r.db, Table: r.tbl, Op: canonical.Op(r.op),
		Key: r.rowKey, Payload: r.payload, Attempt: attempt, CommitTime: r.commitTS}
}

// compressSegment returns the S2-compressed form of a version 1 payload,
// in dst's storage when it is large enough.
func compressSegment(dst, plain []byte) []byte {
	n := s2.MaxEncodedLen(len(plain)) + 1
	if cap(dst) < n {
		dst = make([]byte, 0, n)
	}
	dst = append(dst[:0], segmentS2)
	return append(dst, s2.Encode(dst[1:cap(dst)], plain)...)
}

func appendSegment(buf []byte, recs []*segRecord) []byte {
	buf = append(buf, segmentVersion)
	for _, r := range recs {
		for _, s := range [...]string{r.id, r.changeKey, r.db, r.tbl, r.op, r.rowKey, r.keyHash} {
			buf = binary.AppendUvarint(buf, uint64(len(s)))
			buf = append(buf, s...)
		}
		buf = binary.AppendVarint(buf, r.commitTS.UnixMicro())
		buf = binary.AppendUvarint(buf, uint64(len(r.payload)))
		buf = append(buf, r.payload...)
	}
	return buf
}

var errSegmentCorrupt = errors.New("segment payload is corrupt")

// parseSegment decodes a segment's payload. The records' byte fields alias
// b.
func parseSegment(b []byte) ([]segRecord, error) {
	if len(b) > 0 && b[0] == segmentS2 {
		plain, err := s2.Decode(nil, b[1:])
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errSegmentCorrupt, err)
		}
		b = plain
	}
	if len(b) == 0 || b[0] != segmentVersion {
		return nil, fmt.Errorf("%w: unknown version", errSegmentCorrupt)
	}
	b = b[1:]
	field := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		f := b[k : k+int(n) : k+int(n)]
		b = b[k+int(n):]
		return f, true
	}
	var out []segRecord
	for len(b) > 0 {
		var r segRecord
		for _, dst := range [...]*string{&r.id, &r.changeKey, &r.db, &r.tbl, &r.op, &r.rowKey, &r.keyHash} {
			f, ok := field()
			if !ok {
				return nil, fmt.Errorf("%w: record %d is cut short", errSegmentCorrupt, len(out))
			}
			*dst = string(f)
		}
		us, k := binary.Varint(b)
		if k <= 0 {
			return nil, fmt.Errorf("%w: record %d is cut short", errSegmentCorrupt, len(out))
		}
		b = b[k:]
		r.commitTS = time.UnixMicro(us).UTC()
		f, ok := field()
		if !ok {
			return nil, fmt.Errorf("%w: record %d is cut short", errSegmentCorrupt, len(out))
		}
		r.payload = f
		out = append(out, r)
	}
	return out, nil
}
