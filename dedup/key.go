// Package dedup gives every row change a deterministic identity (its
// changeKey) so that replicas racing to enqueue the same change collapse to
// one outbox row (docs/ARCHITECTURE.md, "Change identity").
//
// Keys come in three kinds:
//
//	g:<gtid>:<ordinal>        GTID mode: the transaction's GTID and the row
//	                          image's position inside it
//	d:<digest>:<occurrence>   digest mode: the change's content digest and how
//	                          many times that digest was seen before, counted
//	                          by an OccurrenceCounter
//	b:<backfill id>:<key digest>  a row read by a backfill
package dedup

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// MaxKeyLen is the longest changeKey the claims and outbox tables can store
// (VARCHAR(191) ASCII).
const MaxKeyLen = 191

// The kinds of change key, as their first byte.
const (
	KindGTID     byte = 'g'
	KindDigest   byte = 'd'
	KindBackfill byte = 'b'
)

// GTIDKey is the changeKey of the row image at position ordinal (from 0)
// inside the transaction gtid. It is the same on every replica and across a
// failover of the source, because both halves come from the binlog itself.
func GTIDKey(gtid string, ordinal int) string {
	return "g:" + gtid + ":" + strconv.Itoa(ordinal)
}

// GTIDBlock is how many consecutive row ordinals of a transaction share one
// claim in GTID mode (see GTIDUnit).
const GTIDBlock = 100

// GTIDUnitOf is the claim key a GTID change key (g:<gtid>:<ordinal>) shares
// with the changes of its transaction whose ordinals fall in the same block
// of GTIDBlock, "" for any other key: one claim per block and
// pipe instead of one per change (a claim is an indexed row, ~7 µs of
// database CPU). Dedup stays exact because a block is always written
// whole, in one enqueue: a transaction is only split between enqueues at
// block boundaries, and a replay (after a crash or a reconnect) reads it
// from its first row, so it meets the same blocks. The "@" keeps unit keys
// apart from change keys.
func GTIDUnitOf(changeKey string) string {
	p, ok := ParseChangeKey(changeKey)
	if !ok || p.Kind != KindGTID || p.A == "" {
		return ""
	}
	return "g:" + p.A + ":@" + strconv.Itoa(p.N/GTIDBlock)
}

// DigestKey is the changeKey of the occurrence-th sighting (from 0) of a
// change with this content digest.
func DigestKey(digest string, occurrence int) string {
	return "d:" + digest + ":" + strconv.Itoa(occurrence)
}

// BackfillKey is the changeKey of the row with key digest keyDigest read by
// backfill id. A re-run of the same backfill collapses onto its earlier
// claims instead of re-sending every row.
func BackfillKey(id, keyDigest string) string {
	return "b:" + id + ":" + keyDigest
}

// BackfillUnit is the claim key the rows of one backfill chunk share: the
// backfill id and the chunk's key range (start exclusive, "" from the
// first row; end inclusive, as the runner encodes them). A chunk is
// emitted whole at its high watermark, and read again only over the same
// range (a retry, a stall, a resumed run), so a second emission meets the
// first one's claim and is dropped as a whole — the first was consistent
// at its own window, and later changes of its keys are streamed.
func BackfillUnit(id, start, end string) string {
	sum := sha256.Sum256([]byte(start + "\x00" + end))
	return "b:" + id + ":@" + hex.EncodeToString(sum[:16])
}

// IsBackfillUnit reports whether a claim key is a BackfillUnit.
func IsBackfillUnit(key string) bool {
	i := strings.LastIndexByte(key, ':')
	return strings.HasPrefix(key, "b:") && i > 0 && i+1 < len(key) && key[i+1] == '@'
}

// ParsedKey is a changeKey split into its parts.
type ParsedKey struct {
	// Kind is KindGTID, KindDigest or KindBackfill.
	Kind byte
	// A is the GTID, the digest, or the backfill id.
	A string
	// N is the ordinal (GTID keys) or the occurrence (digest keys); 0 for
	// backfill keys.
	N int
	// B is the key digest of a backfill key; "" otherwise.
	B string
}

// String composes the key again; for every key ParseChangeKey accepts,
// ParseChangeKey(k).String() == k.
func (p ParsedKey) String() string {
	switch p.Kind {
	case KindGTID:
		return GTIDKey(p.A, p.N)
	case KindDigest:
		return DigestKey(p.A, p.N)
	case KindBackfill:
		return BackfillKey(p.A, p.B)
	}
	return ""
}

// ParseChangeKey splits a stored changeKey into its parts. ok is false for
// anything the constructors above could not have produced, so a malformed
// row (or a key written by a future version) is never mistaken for an
// occurrence count.
//
// The last ':' ends the first part: a MySQL GTID ("uuid:42") contains a
// colon itself, while ordinals, occurrences and key digests never do.
func ParseChangeKey(s string) (ParsedKey, bool) {
	if len(s) < 5 || len(s) > MaxKeyLen || s[1] != ':' {
		return ParsedKey{}, false
	}
	for i := 0; i < len(s); i++ {
		// Keys live in ASCII columns; control characters never belong.
		if s[i] < 0x21 || s[i] > 0x7e {
			return ParsedKey{}, false
		}
	}
	kind, rest := s[0], s[2:]
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 || i == len(rest)-1 {
		return ParsedKey{}, false
	}
	a, tail := rest[:i], rest[i+1:]
	switch kind {
	case KindGTID:
		n, ok := parseCount(tail)
		if !ok {
			return ParsedKey{}, false
		}
		return ParsedKey{Kind: kind, A: a, N: n}, true
	case KindDigest:
		n, ok := parseCount(tail)
		if !ok || strings.IndexByte(a, ':') >= 0 {
			return ParsedKey{}, false
		}
		return ParsedKey{Kind: kind, A: a, N: n}, true
	case KindBackfill:
		if tail[0] == '@' { // a claim unit (BackfillUnit), not a change
			return ParsedKey{}, false
		}
		return ParsedKey{Kind: kind, A: a, B: tail}, true
	}
	return ParsedKey{}, false
}

// parseCount accepts only the canonical decimal spelling strconv.Itoa
// produces for a non-negative int, so that each count has exactly one key.
func parseCount(s string) (int, bool) {
	if s == "" || len(s) > 18 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}
