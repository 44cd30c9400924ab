// Package backfill snapshots the rows a table already has into the outbox,
// consistently with the live binlog stream (DBLog-style watermarks).
//
// Two halves cooperate through the database only:
//
//   - The Runner (cdcout backfill) reads the table in primary-key order, one
//     chunk at a time, by key range (never OFFSET, never a table lock): it
//     writes a LOW watermark row, reads the chunk with a plain SELECT, stores
//     the chunk's rows in the state table backfill_chunks, and writes a HIGH
//     watermark row. Watermarks are rows of the table <state_db>_watermark.watermarks
//     on the SOURCE server, so the binlog carries them in commit order with
//     every other change (the state database itself is never captured).
//   - The Applier runs inside whichever process holds the enqueue lease
//     (cdcout run, or the backfill command's own engine when nothing else
//     streams). When its stream reaches LOW of a chunk it starts collecting
//     the keys of that table changed in the stream; at HIGH it loads the
//     chunk, drops the rows whose key changed inside the window (the streamed
//     change carries the newer state and is already ahead of HIGH), and hands
//     the rest to the enqueuer as op "r" rows at exactly HIGH's position in
//     the stream. The outbox ids are assigned in that order, and drainers
//     deliver a key's rows in id order, so a backfilled row never reaches a
//     consumer after a newer streamed change of its key.
//
// A chunk is marked done once the enqueue transaction holding its rows has
// committed. An Applier that meets a HIGH whose LOW it did not see (it
// started reading between the two) marks the chunk for retry; the Runner
// then reads that key range again under new watermarks. Re-enqueued rows
// collapse on their claims (change key b:<backfill id>:<key digest>).
package backfill

import (
	"crypto/rand"
	"encoding/hex"
	"time"
)

// Watermark table layout. The table lives on the source server in its own
// database, <state_db>_watermark, because the state database is excluded
// from capture as a whole.
const (
	WatermarkTable = "watermarks"
	markLow        = "l"
	markHigh       = "h"
	// The marks of a backfill whose change keys start with the key's
	// order prefix (keyDigest). A replica too old to know them ignores
	// them, so it never applies such a chunk with the other key form: the
	// chunk stalls and is read again once a current replica streams.
	markLowOrdered  = "L"
	markHighOrdered = "H"
)

// Chunk states in backfill_chunks.
const (
	chunkWritten = "written"
	chunkDone    = "done"
	chunkRetry   = "retry"
)

// Backfill states in backfills.
const (
	StatusRunning   = "running"
	StatusDone      = "done"
	StatusFailed    = "failed"
	StatusCancelled = "cancelled"
)

// WatermarkDB is the database on the source holding the watermark table of
// the state database stateDB.
func WatermarkDB(stateDB string) string { return stateDB + watermarkSuffix }

// watermarkSuffix names watermark databases; a stream never routes a
// change of <anything>_watermark.watermarks, whoever wrote it.
const watermarkSuffix = "_watermark"

// newID is a fresh backfill id: sortable by start time, unique.
func newID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "bf" + time.Now().UTC().Format("20060102150405") + hex.EncodeToString(b)
}
