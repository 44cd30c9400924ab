package outbox

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unsafe"

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

// segmentVersion2 is the version 1 form without the key hash field: the
// hash is a function of the row key (appendKeyHash), so a reader
// computes it. Its 64 hex digits were a third of a compressed realistic
// record and do not compress; the database lexes every payload byte of
// the INSERT and writes it to its binary log. The byte is 3, not 2,
// because 2 is segmentS2, the marker a stored payload starts with when
// compressed. A reader of version 1 only stops at it ("unknown version",
// the pipe halts, nothing is skipped), so writers use it only when told
// every replica reads it (SegmentFormat2, config segment_format).
const segmentVersion2 = 3

// segmentS2 marks a payload that is a plain form (either version)
// compressed with S2 (github.com/klauspost/compress/s2). Envelopes are
// JSON with much repetition (column names, change-key prefixes), so a
// segment shrinks about threefold, and with it the bytes the database
// writes twice (table and binary log) and sends to every binlog reader.
const segmentS2 = 2

// Segment formats a Store writes (WithSegmentFormat).
const (
	SegmentFormat1 = 1 // version 1 inside S2: what every release reads
	SegmentFormat2 = 2 // segmentVersion2 inside S2

	// SegmentFormatRead is the newest format this release reads (it reads
	// every older one too); replicas say so in their fleet rows, for
	// segment_format auto.
	SegmentFormatRead = SegmentFormat2
)

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

// appendSegment appends the plain form of recs in the given format
// (SegmentFormat1 or SegmentFormat2).
func appendSegment(buf []byte, recs []*segRecord, format int) []byte {
	buf = appendSegmentVersion(buf, format)
	for _, r := range recs {
		buf = appendSegmentRecord(buf, r, format)
	}
	return buf
}

// appendSegmentVersion appends the version byte a plain form of the
// format starts with.
func appendSegmentVersion(buf []byte, format int) []byte {
	if format == SegmentFormat2 {
		return append(buf, segmentVersion2)
	}
	return append(buf, segmentVersion)
}

// appendSegmentRecord appends one record of a plain form of the format.
func appendSegmentRecord(buf []byte, r *segRecord, format int) []byte {
	for _, s := range [...]string{r.id, r.changeKey, r.db, r.tbl, r.op, r.rowKey} {
		buf = binary.AppendUvarint(buf, uint64(len(s)))
		buf = append(buf, s...)
	}
	if format != SegmentFormat2 {
		buf = binary.AppendUvarint(buf, uint64(len(r.keyHash)))
		buf = append(buf, r.keyHash...)
	}
	buf = binary.AppendVarint(buf, r.commitTS.UnixMicro())
	buf = binary.AppendUvarint(buf, uint64(len(r.payload)))
	return append(buf, r.payload...)
}

// appendKeyHash appends a row key's hash, the hex SHA-256 of its
// canonical JSON: the key_hash that per-key order and the claimers' key
// ranges go by. The enqueue computes it for every record, and a format 2
// segment's reader computes it again instead of reading it, so both call
// this one rule.
func appendKeyHash(dst, rowKey []byte) []byte {
	sum := sha256.Sum256(rowKey)
	return hex.AppendEncode(dst, sum[:])
}

// appendKeyHashView appends rowKey's key hash to hashes and returns the
// grown buffer and the appended hash as a string viewing it, for many
// hashes in one allocation. Appends never change bytes already written, so
// earlier views stay valid when the buffer grows.
func appendKeyHashView(hashes, rowKey []byte) ([]byte, string) {
	at := len(hashes)
	hashes = appendKeyHash(hashes, rowKey)
	h := hashes[at:len(hashes):len(hashes)]
	return hashes, unsafe.String(unsafe.SliceData(h), len(h))
}

var errSegmentCorrupt = errors.New("segment payload is corrupt")

// parseSegment decodes a segment's payload, in either format. The
// records' payloads alias b, or the decompressed form.
//
// A compressed payload is decoded into a buffer of our own that nothing
// writes to afterwards (payloads are capped at their length, so an append
// to one copies), so the string fields are views of it rather than a copy
// each (BenchmarkParseSegment: 6,013 allocations a 1,000-record segment
// before, 13 now). An
// uncompressed (old) payload may be the caller's buffer, and is copied.
func parseSegment(b []byte) ([]segRecord, error) {
	b, owned, err := plainSegment(b)
	if err != nil {
		return nil, err
	}
	v2 := b[0] == segmentVersion2
	b = b[1:]
	total := len(b)
	field := func() ([]byte, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		f := b[k : k+int(n) : k+int(n)]
		b = b[k+int(n):]
		return f, true
	}
	str := func(f []byte) string {
		if owned {
			return unsafe.String(unsafe.SliceData(f), len(f))
		}
		return string(f)
	}
	nf := 7
	if v2 {
		nf = 6 // no key hash
	}
	// The key hashes of a version 2 segment, computed.
	var hashes []byte
	var out []segRecord
	for len(b) > 0 {
		var r segRecord
		fields := [...]*string{&r.id, &r.changeKey, &r.db, &r.tbl, &r.op, &r.rowKey, &r.keyHash}
		var rowKey []byte
		for _, dst := range fields[:nf] {
			f, ok := field()
			if !ok {
				return nil, fmt.Errorf("%w: record %d is cut short", errSegmentCorrupt, len(out))
			}
			*dst = str(f)
			if dst == &r.rowKey {
				rowKey = f
			}
		}
		if v2 {
			if hashes == nil {
				hashes = make([]byte, 0, 64*64)
			}
			hashes, r.keyHash = appendKeyHashView(hashes, rowKey)
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
		if out == nil {
			// Sized from the first record's share of the segment, so a
			// segment of 1,000 records is not copied ten times growing.
			out = make([]segRecord, 0, min(maxSegmentRecords, 1+len(b)/max(1, total-len(b))+1))
		}
		out = append(out, r)
	}
	return out, nil
}

// plainSegment is a stored payload's plain form, S2-decoded (owned: a
// buffer of its own) when compressed, after checking that its first byte
// is a version this release reads.
func plainSegment(b []byte) (plain []byte, owned bool, err error) {
	if len(b) > 0 && b[0] == segmentS2 {
		if b, err = s2.Decode(nil, b[1:]); err != nil {
			return nil, false, fmt.Errorf("%w: %v", errSegmentCorrupt, err)
		}
		owned = true
	}
	if len(b) == 0 || (b[0] != segmentVersion && b[0] != segmentVersion2) {
		return nil, false, fmt.Errorf("%w: unknown version", errSegmentCorrupt)
	}
	return b, owned, nil
}

// SegmentFormatOf reports the format (SegmentFormat1 or SegmentFormat2) a
// stored segment payload was written in.
func SegmentFormatOf(payload []byte) (int, error) {
	plain, _, err := plainSegment(payload)
	if err != nil {
		return 0, err
	}
	if plain[0] == segmentVersion2 {
		return SegmentFormat2, nil
	}
	return SegmentFormat1, nil
}
