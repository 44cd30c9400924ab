package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/dedup"
	"github.com/cdcout/cdcout/outbox"
)

// errLeaseLost ends a tenure: the enqueue lease moved (fenced write) or
// could not be renewed in time. Run goes back to acquiring it.
var errLeaseLost = errors.New("enqueue lease lost")

// errReread ends a tenure so the next one reads again from the checkpoint
// with a freshly seeded occurrence counter (see handleChange).
var errReread = errors.New("digest-mode transaction replayed after part of it was written")

// enqueueStore is what the enqueuer needs of outbox.Store.
type enqueueStore interface {
	Enqueue(ctx context.Context, claimedBy string, fence outbox.Fence, items []outbox.Pending, cp *outbox.Checkpoint) (outbox.EnqueueResult, error)
}

// batchStore is an enqueueStore that prepares a batch (validates, keys and
// encodes it) apart from its transaction: *outbox.Store. The enqueuer then
// prepares the next batch while the write before it runs.
type batchStore interface {
	PrepareBatch(items []outbox.Pending, cp *outbox.Checkpoint) (*outbox.Batch, error)
	EnqueueBatch(ctx context.Context, claimedBy string, fence outbox.Fence, b *outbox.Batch) (outbox.EnqueueResult, error)
}

// openChange is a routed, masked change of the transaction being read,
// not yet keyed: in digest mode its occurrence is only taken at the
// commit, so a transaction the stream replays after a reconnect (from its
// first row) does not count its rows twice.
type openChange struct {
	pipe, sink string
	ch         *canonical.Change
	// filtered, dead: the sink's row filter's decision (rowfilter.go).
	filtered bool
	dead     string
}

// enqueuer turns the stream's events into outbox batches. Batches are
// written at transaction boundaries (with the checkpoint) once they hold
// batchSize rows or the oldest unwritten commit is interval old, and in the
// middle of a transaction (without a checkpoint) when the buffer reaches
// maxBuffer: memory stays bounded whatever a transaction's size.
type enqueuer struct {
	store      enqueueStore
	log        *zap.Logger
	instance   string
	claimedBy  string
	fence      outbox.Fence
	source     string
	routes     []*route
	digestMode bool
	counter    *dedup.OccurrenceCounter
	batchSize  int
	// pipeline: a batch's write runs while the next is read
	// (enqueuewrite.go); without it flush waits for the write.
	pipeline  bool
	maxBuffer int
	interval  time.Duration
	// written is told which pipes got rows, to wake (or start) their
	// drainers.
	written func(pipes []string)
	// valid, when set, reports whether the enqueue lease may still be
	// acted on (its local deadline): a leader that could not renew stops
	// writing before the lease can have expired.
	valid func() bool
	// observe, when set, is told every enqueue's result (metrics).
	observe func(outbox.EnqueueResult)
	// maxRowBytes, when positive, dead-letters a change whose row images
	// are larger (config max_row_bytes).
	maxRowBytes int
	// report, when set, is told every enqueue's outcome (nil for a
	// success), for readiness: the rows and the checkpoint are one write.
	report func(error)
	// hook, when set, sees changes before routing (backfill watermarks;
	// see backfill_hook.go).
	hook WatermarkHook
	// position, when set, is the stream's read position (the hook's
	// Tick).
	position func() binlog.Position
	// tx is the open transaction's metadata (txmeta.go).
	tx txMeta

	mu    sync.Mutex
	ready []outbox.Pending   // keyed records, all before cp unless mid-flushed
	spare []outbox.Pending   // a written batch's slice, for the next ready
	open  []openChange       // the current transaction's rows, unkeyed
	cp    *outbox.Checkpoint // last commit not yet written; nil when none
	since time.Time          // when the oldest unwritten commit arrived
	// midTx is set once rows of the current transaction were written
	// before its commit; a replay of that transaction is then not
	// detectable here (see handleChange).
	midTx bool
	// lastRow is the ordinal of the last row of the current transaction
	// (-1 at a transaction's start); a smaller or equal one is a replay.
	lastRow int

	// The write in flight (enqueuewrite.go): its batch, nil when none,
	// and where its outcome arrives. failed is the error of a write that
	// did not commit (sticky); unsent its batch when the tenure's end cut
	// it short, for final.
	inflight []*batch
	failed   error
	unsent   []*batch

	// Counters for logs and tests.
	recordsWritten, flushes int64
	flushTime               time.Duration
	waitTime                time.Duration // the handler waiting for the write in flight
	maxBuffered             int
}

// handle is the stream handler.
func (q *enqueuer) handle(ctx context.Context, ev binlog.Event) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ev.Change != nil {
		return q.handleChange(ctx, ev.Change)
	}
	return q.handleCommit(ctx, ev.Commit)
}

func (q *enqueuer) handleChange(ctx context.Context, ch *canonical.Change) error {
	if ch.Op == canonical.OpDDL {
		return q.handleDDL(ch)
	}
	if ch.Source.Row <= q.lastRow {
		// The stream replays a transaction cut off by a reconnect from its
		// first row: forget the unkeyed rows of the first reading. Rows
		// already written mid-transaction collapse onto their claims in
		// GTID mode. In digest mode the counter has counted them, so the
		// replay would key them anew: start over from the checkpoint,
		// whose seeding leaves them out.
		if q.digestMode && q.midTx {
			return errReread
		}
		q.log.Debug("transaction replayed after reconnect; dropping its buffered rows",
			zap.Int("rows", len(q.open)), zap.Bool("partly_written", q.midTx))
		clear(q.open)
		q.open = q.open[:0]
		q.txReset()
	}
	// A huge transaction is written in parts (below), and in GTID mode only
	// between blocks of dedup.GTIDBlock ordinals, because a block shares
	// one claim (dedup.GTIDUnitOf) and must be written whole: the rows of
	// the blocks before this row's go out now.
	if !q.digestMode && len(q.open) > 0 && len(q.ready)+len(q.open) >= q.maxBuffer &&
		ch.Source.Row/dedup.GTIDBlock != q.lastRow/dedup.GTIDBlock {
		if err := q.flushOpen(ctx); err != nil {
			return err
		}
	}
	q.lastRow = ch.Source.Row
	if q.hook != nil {
		if skip, err := q.hookChange(ctx, ch); skip || err != nil {
			return err
		}
	}
	for _, r := range q.routes {
		if !r.matches(ch) {
			continue
		}
		oc := openChange{
			pipe: outbox.PipeName(q.instance, ch.Source.DB, ch.Source.Table, r.sink),
			sink: r.sink,
			ch:   r.mask(ch),
		}
		oc.filtered, oc.dead = r.filterOut(ch)
		if r.transactions && !oc.filtered {
			// A change the row filter drops is not the sink's: it takes
			// no place in the transaction and END does not count it (a
			// dead-lettered one does: the sink is missing it).
			oc.ch = q.txPlace(r.sink, oc.ch)
		}
		q.open = append(q.open, oc)
	}
	q.maxBuffered = max(q.maxBuffered, len(q.ready)+len(q.open))
	if q.digestMode && len(q.ready)+len(q.open) >= q.maxBuffer {
		return q.flushOpen(ctx)
	}
	return nil
}

// flushOpen writes a huge transaction's rows read so far without moving
// the checkpoint past it. A crash replays the transaction and its written
// rows collapse onto their claims.
//
// The complete transactions before it go first, with their checkpoint, in
// a database transaction of their own: the open transaction's claims must
// be newer than the checkpoint, or digest mode's seeding
// (outbox.Store.LoadCheckpointAndClaims: claims created up to the
// checkpoint's write) counts them, and their replay gets new occurrences,
// i.e. a second outbox row each.
func (q *enqueuer) flushOpen(ctx context.Context) error {
	if q.cp != nil {
		if err := q.flush(ctx, q.cp); err != nil {
			return err
		}
	}
	if err := q.keyOpen(); err != nil {
		return err
	}
	q.midTx = true
	if err := q.flush(ctx, nil); err != nil {
		return err
	}
	// A part of a huge transaction is written before the next is read:
	// the buffer's ceiling bounds memory (invariant 6), and reading on
	// would hold a second ceiling's worth of rows (peak RSS of the
	// 1,000,000-row transaction 172 → 218 MB on the loaded box).
	return q.wait(ctx)
}

func (q *enqueuer) handleCommit(ctx context.Context, c *binlog.Commit) error {
	q.txEnd(c)
	if c.Held && q.digestMode {
		return q.handleHeldCommit(ctx)
	}
	if err := q.keyOpen(); err != nil {
		return err
	}
	q.midTx = false
	q.lastRow = -1
	if q.hook != nil {
		if err := q.hookCommitted(ctx, c.Pos); err != nil {
			return err
		}
	}
	q.cp = &outbox.Checkpoint{Source: q.source, Pos: c.Pos}
	if q.since.IsZero() {
		q.since = time.Now()
	}
	// A due batch is cut now even while the one before it is written
	// (flush waits for that write): letting it grow meanwhile made fewer,
	// larger transactions, but held up to twice half the buffer ceiling
	// of rows and raised peak RSS by half on a 200,000-change backlog
	// (BenchmarkKafkaEndToEnd narrow, 108–126 → 172–189 MB) without a
	// faster run.
	if len(q.ready) >= q.batchSize || time.Since(q.since) >= q.interval {
		return q.flush(ctx, q.cp)
	}
	return nil
}

// handleHeldCommit ends a transaction read while the stream holds its
// position back (a prepared XA transaction before it, binlog/xa.go): a
// restart replays it. In digest mode its claims must then be newer than the
// checkpoint's last move, or the seeding (claims written up to it) would
// count them and the replay would key the transaction anew, a second row
// per change. So, as for a huge transaction's partial writes, the complete
// transactions before it go first with their checkpoint, this one goes
// without one, and the checkpoint stays where it was until the position
// moves again. (In GTID mode keys do not depend on a counter.)
func (q *enqueuer) handleHeldCommit(ctx context.Context) error {
	if len(q.open) > 0 {
		if q.cp != nil && len(q.ready) > 0 {
			if err := q.flush(ctx, q.cp); err != nil {
				return err
			}
		}
		if err := q.keyOpen(); err != nil {
			return err
		}
		if err := q.flush(ctx, nil); err != nil {
			return err
		}
	}
	q.midTx = false
	q.lastRow = -1
	return nil
}

// withoutImages is ch with its key but without its row images: what a
// dead letter for a change too large to deliver keeps (which row, which
// operation, where in the binlog).
func withoutImages(ch *canonical.Change) *canonical.Change {
	c := *ch
	c.Key, c.KeyCols = ch.KeyRow(), nil
	c.Before, c.After = nil, nil
	return &c
}

// maxKeptImageBytes bounds the changes whose encoded images are kept from
// the digest for the envelope: a wide row's would stay live beside its
// decoded images until its batch is written (invariant 6 holds a value
// once per stage), so those are encoded again instead.
const maxKeptImageBytes = 64 << 10

// imagesOf is the change's encoded images, nil for a wide change or one
// whose images cannot be encoded (the envelope reports those).
func imagesOf(ch *canonical.Change) *canonical.Images {
	if ch.ImageBytes() > maxKeptImageBytes {
		return nil
	}
	im, err := canonical.EncodeImages(ch)
	if err != nil {
		return nil
	}
	return im
}

// digestOf is the change's digest for pipe, from its images when encoded.
func digestOf(pipe string, ch *canonical.Change, im *canonical.Images) string {
	if im == nil {
		return canonical.DigestChange(pipe, ch)
	}
	return canonical.DigestImages(pipe, ch, im)
}

// keyOpen gives the open rows their change keys and moves them to ready.
func (q *enqueuer) keyOpen() error {
	// Pipes without transforms share the change: its images are encoded
	// once for all of them (the digest differs by pipe).
	var lastCh *canonical.Change
	var lastImages *canonical.Images
	for _, o := range q.open {
		ch := o.ch
		if ch != lastCh {
			lastCh, lastImages = ch, imagesOf(ch)
		}
		images := lastImages
		digest := digestOf(o.pipe, ch, images)
		var key, unit string
		if ch.Op == canonical.OpTransaction || ch.Op == canonical.OpDDL {
			key = ch.ChangeKey // txRecord, ddlRecords: deterministic in either mode
		} else if q.digestMode {
			n := q.counter.Next(digest, time.UnixMilli(ch.Source.TsMs))
			key = dedup.DigestKey(digest, n)
		} else {
			if ch.ChangeKey == "" {
				// Only reached with a source that writes GTIDs (else digest
				// mode is on or Open refused change_identity gtid): the
				// change was not tied to its transaction's GTID.
				return fmt.Errorf("change of %s.%s at %s:%d has no GTID although the source writes GTIDs: "+
					"cdcout could not tie it to its transaction (please report this with the position); "+
					"--change-identity digest captures such changes meanwhile", ch.Source.DB, ch.Source.Table, ch.Source.File, ch.Source.Pos)
			}
			key = ch.ChangeKey
			unit = dedup.GTIDUnitOf(key)
		}
		dead := o.dead
		if q.maxRowBytes > 0 && dead == "" {
			if n := ch.ImageBytes(); n > q.maxRowBytes {
				images = nil
				ch, dead = withoutImages(ch), fmt.Sprintf("row images of %d bytes exceed max_row_bytes %d: not delivered, its before and after dropped; re-sync the row", n, q.maxRowBytes)
				q.log.Error("change exceeds max_row_bytes; dead-lettered without its row images",
					zap.String("pipe", o.pipe), zap.String("change_key", key), zap.Int("bytes", n), zap.Int("max_row_bytes", q.maxRowBytes))
			}
		}
		if dead != "" || o.filtered {
			images = nil // no envelope
		}
		q.ready = append(q.ready, outbox.Pending{Pipe: o.pipe, Sink: o.sink, Change: ch, ChangeKey: key, Digest: digest, Unit: unit, Dead: dead, Filtered: o.filtered, Images: images})
	}
	clear(q.open)
	q.open = q.open[:0]
	return nil
}

// tick writes a batch whose oldest commit has waited the flush interval;
// the stream may be idle, so commits alone cannot be relied on to do it.
// It also collects a finished write, so an idle stream's last batch is
// accounted (and its backfill chunks marked done) without waiting for
// the next event. busy: the hook wants the next tick soon.
func (q *enqueuer) tick(ctx context.Context) (busy bool, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.poll(ctx); err != nil {
		return false, err
	}
	if err := q.hookTick(ctx); err != nil {
		return false, err
	}
	busy = q.hook != nil && q.hook.Busy()
	if len(q.inflight) > 0 || q.cp == nil || time.Since(q.since) < q.interval {
		return busy, nil
	}
	return busy, q.flush(ctx, q.cp)
}
