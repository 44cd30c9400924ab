package outbox

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/dedup"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/state"
)

// Statement size bounds. A batch of any size is written in one transaction,
// in statements of at most this many rows or payload bytes, so a huge source
// transaction never needs a packet larger than max_allowed_packet (16 MiB by
// default) and placeholders stay far below the 65,535 limit.
const (
	maxRowsPerStatement  = 500
	maxBytesPerStatement = 4 << 20
	// maxEnqueueAttempts bounds retries of a transaction the server rolled
	// back as a deadlock victim.
	maxEnqueueAttempts = 4
)

// Pending is one change to write for one pipe.
type Pending struct {
	Pipe string // "<instance>:<db.table>:<sink>"
	Sink string
	// Change is already masked for this pipe. Its ChangeKey is replaced by
	// the ChangeKey below in the stored envelope.
	Change *canonical.Change
	// ChangeKey is the durable identity (dedup.GTIDKey, DigestKey or
	// BackfillKey); Digest is canonical.Digest of the change for this pipe,
	// stored with the claim in every mode so that replicas which decoded
	// the same change differently are noticed.
	ChangeKey, Digest string
	// Unit, when set, is a claim key the change shares with the other
	// changes of its pipe and unit (dedup.GTIDUnitOf): they take one claim
	// together and are written or skipped together. Every change of a unit
	// must be in the same Enqueue call. Empty: the change is claimed on
	// its own, under ChangeKey.
	Unit string
	// Dead, when set, is why the change is not to be delivered (its row
	// images exceed max_row_bytes and were dropped from Change): it is
	// claimed as any change, and written as a dead outbox row with this
	// reason instead of a segment record, so it is seen in `cdcout dead
	// list` and counted, never silently skipped.
	Dead string
	// Filtered: the sink's row filter keeps the change from the sink. It
	// is claimed as any change (a re-read collapses on the claim) but no
	// record is written.
	Filtered bool
	// Images, when set, are Change's row images already encoded
	// (canonical.EncodeImages, for the digest): the envelope embeds them
	// instead of encoding the images again.
	Images *canonical.Images
}

// Fence is the enqueue lease an enqueue's checkpoint advance is conditional
// on: the lease row must still have this holder and epoch and be unexpired
// on the database clock.
type Fence struct {
	Lease  string
	Holder string
	Epoch  uint64
}

// FenceOf is the fence of a held enqueue lease.
func FenceOf(l lease.Lease) Fence {
	return Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}
}

// EnqueueResult counts what one Enqueue did with its items.
type EnqueueResult struct {
	// Records counts the records written now, in segments or as rows
	// (claims taken now, or taken earlier by us and left without records).
	Records int
	// AlreadyOurs are items whose claim and row this replica wrote before
	// (a replay after a crash or a retried batch).
	AlreadyOurs int
	// OthersClaims are items another replica claimed first; it writes
	// their rows.
	OthersClaims int
	// DigestMismatches are existing claims whose digest differs from the
	// item's: two decodings of one change differ (schema drift). Each is
	// logged as a warning.
	DigestMismatches int
	// Pipes lists the pipes that received at least one new row, in first
	// appearance order, so the caller can wake their drainers.
	Pipes []string
	// LastID is the greatest outbox id the transaction drew for its
	// changes ("" when it had none): a batch that follows it
	// (Batch.After) must have greater ones.
	LastID string
}

// ErrPredecessor is what a Batch.After wait returns when the batch it
// follows did not commit, so this one must not either; it is not retried.
var ErrPredecessor = errors.New("the enqueue transaction before this one did not commit")

// errIDOrder: the batch before this one was retried after this one drew
// its ids, so its ids are greater; this one is rolled back and retried
// with new ids, which keeps a pipe's records in commit order.
var errIDOrder = errors.New("ids drawn before the previous transaction's retry")

// predecessorWait bounds how long a transaction holds its locks waiting
// for the one before it to commit; past it, it rolls back and waits for
// that one outside any transaction. The two take disjoint claims, so the
// wait is normally the other's remaining statements, milliseconds; a
// predecessor that takes longer is a very large batch, or one waiting on a
// lock this transaction or another holds, which only this rollback may
// release (InnoDB sees no cycle that runs through cdcout). A second keeps
// such a stall short (it was 5 s) at the price of writing a batch twice
// behind a predecessor that is only slow. (A variable for tests.)
var predecessorWait = time.Second

// errPredecessorSlow: the transaction before this one took longer than
// predecessorWait to commit; this one rolls back and retries.
var errPredecessorSlow = errors.New("the enqueue transaction before this one is slow to commit")

// errClaimVanished: a claim the INSERT IGNORE found was gone when read back
// (retention deleted it in between). The whole transaction is retried.
var errClaimVanished = errors.New("claim vanished between insert and read-back")

// pendingRecord is a validated Pending with everything that does not depend on the
// outbox id computed once, outside the retry loop.
type pendingRecord struct {
	Pending
	change   canonical.Change // a copy, with ChangeKey set
	rowKey   string
	keyHash  string
	commitTS time.Time
	unit     *claimUnit
	// Per attempt:
	id string
}

// claimUnit is the changes of one pipe that share one claim: a GTID block,
// or a single change.
type claimUnit struct {
	pipe, key, digest string
	items             []*pendingRecord
	state             claimState
}

func (u *claimUnit) id() string { return u.items[0].id }

type claimState int

const (
	claimNew         claimState = iota // inserted by this attempt
	claimReentrant                     // ours from earlier, no outbox row yet
	claimAlreadyOurs                   // ours from earlier, row written
	claimOthers                        // another replica's
)

// Enqueue writes items and, when cp is not nil, advances the checkpoint,
// all in one transaction (docs/ARCHITECTURE.md, invariants 1–3):
//
//  1. INSERT IGNORE a claim (pipe, change_key, digest, claimed_by) per
//     claim unit: a change, or a block of one transaction's changes that
//     share Pending.Unit; the claims primary key decides which replica
//     writes each unit.
//  2. Read the claims back (locking) unless every insert succeeded: claims
//     with our claimedBy and no outbox rows are ours to finish
//     (re-entrant); others' claims are skipped, their digests compared.
//  3. Write the records of the units that are ours as segments (one per
//     pipe, up to maxSegmentRecords), with ids from NewID in item order,
//     so ids follow commit order.
//  4. Advance the checkpoint, conditional on fence; a lost lease rolls
//     everything back and returns ErrFenced.
//
// Because the checkpoint moves only in the transaction that holds the rows
// of every change before it, a crash at any point resumes without loss, and
// a replay collapses onto the existing claims without duplicates.
//
// Items are written in statements of bounded size inside the one
// transaction. A transaction chosen as a deadlock victim is retried.
func (s *Store) Enqueue(ctx context.Context, claimedBy string, fence Fence, items []Pending, cp *Checkpoint) (EnqueueResult, error) {
	b, err := s.PrepareBatch(items, cp)
	if err != nil {
		return EnqueueResult{}, err
	}
	return s.EnqueueBatch(ctx, claimedBy, fence, b)
}

// Batch is what PrepareBatch made of a batch of changes for EnqueueBatch.
type Batch struct {
	its   []*pendingRecord
	units []*claimUnit
	dups  int
	cp    *Checkpoint
	// segs are the batch's segments, encoded ahead of the transaction
	// with ids drawn by PrepareBatch, on the assumption that every claim
	// is new; draws is the id generator's count after them. They serve
	// the first attempt only, and only if no id was drawn since: the
	// batch before may have been retried with later ids, and a second
	// attempt must never reuse ids (enqueueOnce). nil: the transaction
	// encodes them, as it does when a claim turns out not to be new.
	segs  []encodedSegment
	draws uint64
	spent bool
	// after, when set, waits for the transaction this batch follows
	// (After).
	after func(ctx context.Context) (lastID string, err error)
	// sealed: Seal decided whether segs serve the first attempt (fresh).
	sealed, fresh bool
}

// Seal decides, on the goroutine that prepared b and before it hands b to
// another, whether b's prepared segments may serve its first attempt: only
// if no id was drawn since they were encoded. EnqueueBatch seals a batch
// nobody sealed. Decided later, on the
// writer's goroutine, the next batch's preparation (on this goroutine)
// could have drawn ids in between, so b encoded itself again inside its
// transaction with ids greater than the next batch's (and, with two
// transactions in flight, made that one retry: 30 of 201 batches in
// BenchmarkFileEndToEnd narrow).
func (b *Batch) Seal() {
	b.sealed = true
	b.fresh = !b.spent && b.segs != nil && ids.drawn() == b.draws
}

// After makes b's transaction follow another that is still running: b
// writes its claims and segments meanwhile, but advances its checkpoint
// and commits only once wait reports that the other committed (with the
// greatest id it drew; an error when it did not, and then b does not
// commit either). So two enqueue transactions overlap, the database
// working on both, and still commit in stream order (invariant 1), their
// ids in commit order: if the other was retried with ids drawn after b's,
// b is retried with new ones.
func (b *Batch) After(wait func(ctx context.Context) (lastID string, err error)) { b.after = wait }

// maxPreparedSegmentBytes bounds the compressed segments a prepared batch
// holds; a larger one is encoded segment by segment in its transaction.
const maxPreparedSegmentBytes = 8 << 20

// PrepareBatch validates items and keys them, and encodes their segments
// ahead of the transaction: the enqueue pipeline does this while the
// transaction of the batch before runs, rather than inside its own.
func (s *Store) PrepareBatch(items []Pending, cp *Checkpoint) (*Batch, error) {
	its, units, dups, err := s.prepare(items)
	if err != nil {
		return nil, err
	}
	b := &Batch{its: its, units: units, dups: dups, cp: cp}
	if len(its) == 0 {
		return b, nil
	}
	b.draws = ids.drawFor(its)
	size := 0
	err = s.encodeSegments(its, func(seg *encodedSegment) error {
		if size += len(seg.payload); size > maxPreparedSegmentBytes {
			return errPreparedTooLarge
		}
		seg.payload = bytes.Clone(seg.payload)
		b.segs = append(b.segs, *seg)
		return nil
	})
	if err != nil {
		// Too large to hold, or an encoding error the transaction reports.
		b.segs = nil
	}
	return b, nil
}

var errPreparedTooLarge = errors.New("prepared segments too large")

// EnqueueBatch is Enqueue of a prepared batch. A batch may be passed again
// after an error.
func (s *Store) EnqueueBatch(ctx context.Context, claimedBy string, fence Fence, b *Batch) (EnqueueResult, error) {
	if claimedBy == "" || utf8.RuneCountInString(claimedBy) > 255 {
		return EnqueueResult{}, fmt.Errorf("enqueue: claimedBy must be 1–255 characters")
	}
	if b.cp != nil && (fence.Lease == "" || fence.Holder == "" || b.cp.Source == "") {
		return EnqueueResult{}, fmt.Errorf("enqueue: a checkpoint needs a source and a fence (lease and holder)")
	}
	if len(b.its) == 0 && b.cp == nil {
		return EnqueueResult{AlreadyOurs: b.dups}, nil
	}
	if !b.sealed {
		b.Seal()
	}
	for attempt := 1; ; attempt++ {
		after := b.after
		if after != nil && attempt > 1 {
			// Waited for outside the transaction from now on: this
			// one's locks cannot stand in the other's way.
			if _, err := after(ctx); err != nil {
				return EnqueueResult{}, err
			}
		}
		var segs []encodedSegment
		if b.fresh && !b.spent {
			segs = b.segs
		}
		b.spent = true
		res, err := s.enqueueOnce(ctx, claimedBy, fence, b.its, b.units, b.cp, segs, after)
		if err == nil {
			res.AlreadyOurs += b.dups
			return res, nil
		}
		retry := state.Errno(err) == state.ErrnoLockDeadlock || errors.Is(err, errClaimVanished) || errors.Is(err, errIDOrder) ||
			errors.Is(err, errPredecessorSlow)
		if !retry || attempt >= maxEnqueueAttempts || ctx.Err() != nil {
			return EnqueueResult{}, err
		}
		s.logger.Info("enqueue transaction retried", zap.Int("attempt", attempt), zap.Error(err))
	}
}

// prepare validates items and computes their row data. Items repeating an
// earlier item's (pipe, change_key) are dropped and counted: one change is
// one row, even if a caller hands it over twice.
func (s *Store) prepare(items []Pending) ([]*pendingRecord, []*claimUnit, int, error) {
	its := make([]*pendingRecord, 0, len(items))
	// The records in one allocation, and their key hashes in another:
	// per record, they were a tenth of the batch's preparation.
	recs := make([]pendingRecord, len(items))
	hashes := make([]byte, 0, 64*len(items))
	seen := make(map[[2]string]struct{}, len(items))
	var units []*claimUnit
	unitOf := map[[2]string]*claimUnit{}
	dups := 0
	for i, p := range items {
		if err := validatePending(p); err != nil {
			return nil, nil, 0, fmt.Errorf("enqueue item %d (pipe %q, change key %q): %w", i, p.Pipe, p.ChangeKey, err)
		}
		k := [2]string{p.Pipe, p.ChangeKey}
		if _, ok := seen[k]; ok {
			dups++
			s.logger.Warn("change handed to enqueue twice in one batch; keeping the first",
				zap.String("pipe", p.Pipe), zap.String("change_key", p.ChangeKey))
			continue
		}
		seen[k] = struct{}{}
		it := &recs[i]
		it.Pending, it.change = p, *p.Change
		it.change.ChangeKey = p.ChangeKey
		it.rowKey = canonical.KeyJSONOf(p.Change)
		if it.rowKey == "" {
			return nil, nil, 0, fmt.Errorf("enqueue item %d (pipe %q, change key %q): key cannot be encoded", i, p.Pipe, p.ChangeKey)
		}
		hashes, it.keyHash = appendKeyHashView(hashes, unsafe.Slice(unsafe.StringData(it.rowKey), len(it.rowKey)))
		it.commitTS = time.UnixMilli(p.Change.Source.TsMs).UTC()
		its = append(its, it)
		uk := [2]string{p.Pipe, p.ChangeKey}
		if p.Unit != "" {
			uk[1] = p.Unit
		}
		u := unitOf[uk]
		if u == nil || p.Unit == "" {
			u = &claimUnit{pipe: p.Pipe, key: uk[1]}
			unitOf[uk] = u
			units = append(units, u)
		}
		u.items = append(u.items, it)
		it.unit = u
	}
	for _, u := range units {
		switch {
		case len(u.items) == 1 && u.key == u.items[0].ChangeKey:
			u.digest = u.items[0].Digest
		case dedup.IsBackfillUnit(u.key):
			// A chunk read again may hold other rows (they changed in
			// between); that is no decoding drift, so its claim carries
			// the digest of its key, which every reading shares.
			sum := sha256.Sum256([]byte(u.key))
			u.digest = hex.EncodeToString(sum[:])
		default:
			u.digest = unitDigest(u.items)
		}
	}
	return its, units, dups, nil
}

// unitDigest is what a unit's claim stores to notice two decodings of the
// same changes: the SHA-256 of its changes' digests in order.
func unitDigest(items []*pendingRecord) string {
	h := sha256.New()
	for _, it := range items {
		h.Write([]byte(it.Digest))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func validatePending(p Pending) error {
	switch {
	case p.Change == nil:
		return errors.New("no change")
	case p.Pipe == "" || longerThan(p.Pipe, 255):
		return errors.New("pipe must be 1–255 characters")
	case p.Sink == "" || longerThan(p.Sink, 128):
		return errors.New("sink must be 1–128 characters")
	case !printableASCII(p.ChangeKey, 191):
		return errors.New("change key must be 1–191 printable ASCII characters")
	case !printableASCII(p.Digest, 64):
		return errors.New("digest must be 1–64 printable ASCII characters")
	case p.Unit != "" && !printableASCII(p.Unit, 191):
		return errors.New("unit must be 1–191 printable ASCII characters")
	case longerThan(p.Change.Source.DB, 64) || longerThan(p.Change.Source.Table, 64):
		return errors.New("database or table name longer than 64 characters")
	case len(p.Change.Op) != 1:
		return fmt.Errorf("invalid op %q", string(p.Change.Op))
	}
	// INSERT IGNORE turns more than duplicate keys into warnings (it would
	// truncate an over-long value), which is why every column is checked
	// above rather than left to the server.
	return nil
}

// longerThan reports whether s has more than max characters, counting
// them only when its bytes could be that many (it is asked of four
// strings of every enqueued change).
func longerThan(s string, max int) bool {
	return len(s) > max && utf8.RuneCountInString(s) > max
}

func printableASCII(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// segs, unless nil, are its's segments encoded with the ids its holds
// (Batch.segs): they are written if every claim is ours, and otherwise
// the records that are ours are encoded here.
//
// after, when set, is Batch.after: waited for before the checkpoint moves.
func (s *Store) enqueueOnce(ctx context.Context, claimedBy string, fence Fence, its []*pendingRecord, units []*claimUnit, cp *Checkpoint, segs []encodedSegment, after func(context.Context) (string, error)) (EnqueueResult, error) {
	// READ COMMITTED: the locking read-back sees the latest committed claims,
	// and InnoDB takes no gap locks, so concurrent enqueuers of neighbouring
	// keys do not deadlock each other.
	tx, err := s.beginReadCommitted(ctx)
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("enqueue: begin: %w", err)
	}
	defer tx.Rollback()

	// Ids are drawn for every item, in item order, before anything is
	// written: a claim carries the id of its unit's first row, which is
	// how the read-back tells "claimed by this transaction" from "claimed
	// by this replica earlier".
	if segs == nil {
		ids.drawFor(its)
	}
	for _, u := range units {
		u.state = claimNew
	}
	// Claims are taken in primary-key order, so concurrent enqueuers of
	// overlapping batches lock rows in the same order and cannot deadlock.
	byKey := slices.Clone(units)
	slices.SortFunc(byKey, func(a, b *claimUnit) int {
		return cmp.Or(strings.Compare(a.pipe, b.pipe), strings.Compare(a.key, b.key))
	})

	var res EnqueueResult
	for start := 0; start < len(byKey); start += maxRowsPerStatement {
		chunk := byKey[start:min(start+maxRowsPerStatement, len(byKey))]
		inserted, err := s.insertClaims(ctx, tx, claimedBy, chunk)
		if err != nil {
			return EnqueueResult{}, err
		}
		if inserted == len(chunk) {
			continue // every claim is new: nothing to read back
		}
		if err := s.readBackClaims(ctx, tx, claimedBy, chunk, &res); err != nil {
			return EnqueueResult{}, err
		}
	}

	var ours []*pendingRecord
	seenPipe := map[string]bool{}
	for _, it := range its {
		switch it.unit.state {
		case claimNew, claimReentrant:
			ours = append(ours, it)
			if !seenPipe[it.Pipe] {
				seenPipe[it.Pipe] = true
				res.Pipes = append(res.Pipes, it.Pipe)
			}
		case claimAlreadyOurs:
			res.AlreadyOurs++
		case claimOthers:
			res.OthersClaims++
		}
	}
	if err := s.insertDeads(ctx, tx, ours); err != nil {
		return EnqueueResult{}, err
	}
	// kept: the prepared segments written, whose payloads (immutable,
	// Batch.segs) Recent may keep once committed.
	var kept []encodedSegment
	if segs != nil && len(ours) == len(its) {
		for i := range segs {
			if err := s.insertSegment(ctx, tx, &segs[i]); err != nil {
				return EnqueueResult{}, err
			}
		}
		kept = segs
	} else if err := s.encodeSegments(ours, func(seg *encodedSegment) error { return s.insertSegment(ctx, tx, seg) }); err != nil {
		return EnqueueResult{}, err
	}
	for _, u := range units {
		if u.state != claimReentrant {
			continue
		}
		// Rare (a claim left without its rows); one statement each is fine.
		if _, err := tx.ExecContext(ctx, "UPDATE "+s.claims+" SET outbox_id = ? WHERE pipe = ? AND change_key = ?",
			u.id(), u.pipe, u.key); err != nil {
			return EnqueueResult{}, fmt.Errorf("enqueue: link claim %s to its rows: %w", u.key, err)
		}
	}
	res.Records = len(ours)
	if len(its) > 0 {
		res.LastID = its[len(its)-1].id
	}

	if after != nil {
		if err := awaitPredecessor(ctx, after, its); err != nil {
			if errors.Is(err, errPredecessorSlow) {
				s.logServerWaits(ctx)
			}
			return EnqueueResult{}, err
		}
	}
	if cp != nil {
		if err := s.advanceCheckpoint(ctx, tx, fence, cp); err != nil {
			return EnqueueResult{}, err
		}
	}
	if err := tx.Commit(); err != nil {
		return EnqueueResult{}, fmt.Errorf("enqueue: commit: %w", err)
	}
	for i := range kept {
		s.recent.put(kept[i].firstID, kept[i].pipe, kept[i].payload)
	}
	return res, nil
}

// awaitPredecessor waits, inside the transaction, for the one it follows
// to commit (Batch.After), at most predecessorWait, and checks that its
// ids came before ours.
func awaitPredecessor(ctx context.Context, after func(context.Context) (string, error), its []*pendingRecord) error {
	wctx, cancel := context.WithTimeout(ctx, predecessorWait)
	defer cancel()
	last, err := after(wctx)
	switch {
	case err != nil && ctx.Err() == nil && wctx.Err() != nil:
		return errPredecessorSlow
	case err != nil:
		return err
	case len(its) > 0 && last != "" && its[0].id <= last:
		return errIDOrder
	}
	return nil
}

// beginReadCommitted begins a READ COMMITTED transaction: on the pool
// WithReadCommitted gave, whose sessions are at that level (START
// TRANSACTION alone), or else with SET TRANSACTION first.
func (s *Store) beginReadCommitted(ctx context.Context) (*sql.Tx, error) {
	if s.readCommitted != nil {
		return s.readCommitted.BeginTx(ctx, nil)
	}
	return s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

func (s *Store) insertClaims(ctx context.Context, tx *sql.Tx, claimedBy string, chunk []*claimUnit) (int, error) {
	var q strings.Builder
	q.WriteString("INSERT IGNORE INTO " + s.claims + " (pipe, change_key, digest, claimed_by, outbox_id) VALUES ")
	args := make([]any, 0, 5*len(chunk))
	for i, u := range chunk {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteString("(?,?,?,?,?)")
		args = append(args, u.pipe, u.key, u.digest, claimedBy, u.id())
	}
	r, err := tx.ExecContext(ctx, q.String(), args...)
	if err != nil {
		return 0, fmt.Errorf("enqueue: insert claims: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("enqueue: insert claims: %w", err)
	}
	return int(n), nil
}

type storedClaim struct {
	claimedBy, digest string
	outboxID          sql.NullString
}

// readBackClaims reads the chunk's claims with a locking read and classifies
// each unit. chunk is sorted by (pipe, key).
func (s *Store) readBackClaims(ctx context.Context, tx *sql.Tx, claimedBy string, chunk []*claimUnit, res *EnqueueResult) error {
	var q strings.Builder
	q.WriteString("SELECT pipe, change_key, claimed_by, digest, outbox_id FROM " + s.claims + " WHERE ")
	args := make([]any, 0, 2*len(chunk))
	// Grouped per pipe as pipe = ? AND change_key IN (…), a shape every
	// MySQL and MariaDB version turns into primary-key ranges; a full scan
	// under FOR UPDATE would lock the whole table.
	for i := 0; i < len(chunk); {
		j := i
		for j < len(chunk) && chunk[j].pipe == chunk[i].pipe {
			j++
		}
		if i > 0 {
			q.WriteString(" OR ")
		}
		q.WriteString("(pipe = ? AND change_key IN (")
		args = append(args, chunk[i].pipe)
		for k := i; k < j; k++ {
			if k > i {
				q.WriteByte(',')
			}
			q.WriteByte('?')
			args = append(args, chunk[k].key)
		}
		q.WriteString("))")
		i = j
	}
	q.WriteString(" FOR UPDATE")
	rows, err := tx.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return fmt.Errorf("enqueue: read back claims: %w", err)
	}
	defer rows.Close()
	found := make(map[[2]string]storedClaim, len(chunk))
	for rows.Next() {
		var pipe, key string
		var c storedClaim
		if err := rows.Scan(&pipe, &key, &c.claimedBy, &c.digest, &c.outboxID); err != nil {
			return fmt.Errorf("enqueue: read back claims: %w", err)
		}
		found[[2]string{pipe, key}] = c
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("enqueue: read back claims: %w", err)
	}
	for _, u := range chunk {
		c, ok := found[[2]string{u.pipe, u.key}]
		if !ok {
			return errClaimVanished
		}
		mine := c.claimedBy == claimedBy
		switch {
		case mine && c.outboxID.Valid && c.outboxID.String == u.id():
			u.state = claimNew
			continue // taken by this transaction: same digest by construction
		case mine && !c.outboxID.Valid:
			u.state = claimReentrant
		case mine:
			u.state = claimAlreadyOurs
		default:
			u.state = claimOthers
		}
		if c.digest != u.digest {
			res.DigestMismatches++
			// Row data stays out of the log; pipe and key find the rows.
			s.logger.Warn("digest mismatch: an existing claim was decoded differently (schema drift between replicas?)",
				zap.String("pipe", u.pipe), zap.String("change_key", u.key), zap.Int("changes", len(u.items)),
				zap.String("claimed_by", c.claimedBy), zap.String("claim_digest", c.digest),
				zap.String("digest", u.digest))
		}
	}
	return nil
}

// wideSegmentBytes is the segment size beyond which its buffers are not
// kept for the next segment (a wide record's would stay live for the
// whole enqueue).
const wideSegmentBytes = 1 << 20

// segmentBuffer is encodeSegments' buffers, kept from one batch to the
// next: allocated per batch, a batch's plain and compressed forms (a
// megabyte or two each, grown by appends) were zeroed and returned to the
// OS about as often as they were written (BenchmarkPrepareBatch: a third
// of its time in memclr and madvise). None is kept beyond
// pooledSegmentBytes: a segment of 1,000 records of up to 2 KB each, a
// batch of wide records' buffers are let go.
type segmentBuffer struct{ plain, compressed, envelope []byte }

const pooledSegmentBytes = 2 << 20

var segmentBuffers = sync.Pool{New: func() any { return new(segmentBuffer) }}

func (b *segmentBuffer) put() {
	for _, p := range []*[]byte{&b.plain, &b.compressed, &b.envelope} {
		if cap(*p) > pooledSegmentBytes {
			*p = nil
		}
	}
	segmentBuffers.Put(b)
}

// insertDead writes a change that is not to be delivered (Pending.Dead) as
// a dead outbox row carrying the reason.
func (s *Store) insertDead(ctx context.Context, tx *sql.Tx, it *pendingRecord) error {
	payload, err := canonical.MarshalEnvelope(&it.change, it.id)
	if err != nil {
		return fmt.Errorf("enqueue: encode change %s for pipe %s: %w", it.ChangeKey, it.Pipe, err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+s.outbox+" (id, pipe, sink, change_key, db, tbl, op, row_key, key_hash, commit_ts, payload,"+
		" status, attempts, next_attempt_at, last_error, last_error_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,'dead',0,NOW(6),?,NOW(6))",
		it.id, it.Pipe, it.Sink, it.ChangeKey, it.change.Source.DB, it.change.Source.Table, string(it.change.Op), it.rowKey, it.keyHash,
		it.commitTS, payload, truncate(it.Dead, maxErrorLen)); err != nil {
		return fmt.Errorf("enqueue: dead-letter change %s for pipe %s: %w", it.ChangeKey, it.Pipe, err)
	}
	return nil
}

// encodedSegment is one segment row, encoded and compressed.
type encodedSegment struct {
	pipe, sink      string
	records         int
	firstID, lastID string
	firstCommit     time.Time
	payload         []byte
}

// insertDeads writes the dead changes of ours (Pending.Dead) as dead rows.
func (s *Store) insertDeads(ctx context.Context, tx *sql.Tx, ours []*pendingRecord) error {
	for _, it := range ours {
		if !it.Filtered && it.Dead != "" {
			if err := s.insertDead(ctx, tx, it); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Store) insertSegment(ctx context.Context, tx *sql.Tx, seg *encodedSegment) error {
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+s.segments+
		" (id, pipe, sink, records, last_id, first_commit_ts, payload) VALUES (?,?,?,?,?,?,?)",
		seg.firstID, seg.pipe, seg.sink, seg.records, seg.lastID, seg.firstCommit, seg.payload); err != nil {
		return fmt.Errorf("enqueue: insert segment of %d records for pipe %s: %w", seg.records, seg.pipe, err)
	}
	return nil
}

// encodeSegments encodes the records of ours (not filtered, not dead) as
// segments and hands each to emit, whose argument (its payload above all)
// is valid only during the call: per pipe, in item order, segments of at
// most maxSegmentRecords records and maxSegmentBytes bytes. A segment's id
// is its first record's, so segments of a pipe sort in commit order. A
// barrier is alone in its segment. A sink's changes and its transaction
// records are in different pipes, so no cut is needed for them: a
// segment of changes waits for the BEGINs older than its last record
// (oldestSegment).
//
// A record's envelope is encoded into one buffer reused for every record
// and appended to the segment's plain form as it grows, so the records of
// a segment cost no allocation each (an envelope of its own per record,
// copied into the plain form at the cut, was a tenth of the allocation
// on realistic rows).
func (s *Store) encodeSegments(ours []*pendingRecord, emit func(*encodedSegment) error) error {
	var pipes []string
	byPipe := map[string][]*pendingRecord{}
	for _, it := range ours {
		if _, ok := byPipe[it.Pipe]; !ok {
			pipes = append(pipes, it.Pipe)
		}
		byPipe[it.Pipe] = append(byPipe[it.Pipe], it)
	}
	// The segment being built: its plain form in buf, its records' count
	// and first and last of them.
	var (
		n           int
		first, last *pendingRecord
	)
	// One format for the whole call: a segment's version byte and its
	// records must agree though SetSegmentFormat may run meanwhile.
	format := s.SegmentFormat()
	bufs := segmentBuffers.Get().(*segmentBuffer)
	defer bufs.put()
	buf, zbuf, envel := bufs.plain, bufs.compressed, bufs.envelope
	defer func() { bufs.plain, bufs.compressed, bufs.envelope = buf, zbuf, envel }()
	flush := func(pipe, sink string) error {
		if n == 0 {
			return nil
		}
		zbuf = compressSegment(zbuf, buf)
		if cap(buf) > pooledSegmentBytes {
			// Wide records: let their plain form go before the statement
			// makes one more copy (the packet), rather than hold three.
			buf = nil
		}
		seg := encodedSegment{pipe: pipe, sink: sink, records: n, firstID: first.id, lastID: last.id,
			firstCommit: first.commitTS, payload: zbuf}
		if err := emit(&seg); err != nil {
			return err
		}
		n, first, last = 0, nil, nil
		if cap(zbuf) > pooledSegmentBytes {
			zbuf = nil
		}
		return nil
	}
	for _, pipe := range pipes {
		sink := byPipe[pipe][0].Sink
		for _, it := range byPipe[pipe] {
			if it.Filtered || it.Dead != "" {
				continue
			}
			var err error
			if it.Images != nil {
				envel, err = canonical.AppendEnvelopeImages(envel[:0], &it.change, it.id, it.Images)
			} else {
				envel, err = canonical.AppendEnvelope(envel[:0], &it.change, it.id)
			}
			if err != nil {
				return fmt.Errorf("enqueue: encode change %s for pipe %s: %w", it.ChangeKey, it.Pipe, err)
			}
			r := segRecord{id: it.id, changeKey: it.ChangeKey, db: it.change.Source.DB, tbl: it.change.Source.Table,
				op: string(it.change.Op), rowKey: it.rowKey, keyHash: it.keyHash, commitTS: it.commitTS, payload: envel}
			if n > 0 && (n >= maxSegmentRecords || len(buf)+r.size() > maxSegmentBytes || isBarrier(r.op)) {
				if err := flush(pipe, sink); err != nil {
					return err
				}
			}
			if n == 0 {
				buf, first = appendSegmentVersion(buf[:0], format), it
			}
			buf = appendSegmentRecord(buf, &r, format)
			n, last = n+1, it
			if cap(envel) > wideSegmentBytes {
				envel = nil
			}
			if isBarrier(r.op) {
				// Alone in its segment (barrier.go).
				if err := flush(pipe, sink); err != nil {
					return err
				}
			}
		}
		if err := flush(pipe, sink); err != nil {
			return err
		}
	}
	return nil
}

// lastWaitsLog is when logServerWaits last logged (unix nanoseconds).
var lastWaitsLog atomic.Int64

// logServerWaits logs, at most once a minute, what the state database's
// busy sessions are doing while an enqueue transaction waits for a slow
// predecessor (still open, so whatever holds the predecessor up still
// does): each session's command, state and time, its InnoDB transaction's
// state and the start of its statement. That is what tells a lock held by
// another tool, a metadata lock or a cycle through cdcout apart. Of each
// statement only its head is logged (statementHead): past it are values,
// and another tool's statement may carry a password.
func (s *Store) logServerWaits(ctx context.Context) {
	now := time.Now().UnixNano()
	last := lastWaitsLog.Load()
	if now-last < int64(time.Minute) || !lastWaitsLog.CompareAndSwap(last, now) {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rows, err := s.db.QueryContext(qctx, `SELECT p.ID, p.COMMAND, p.TIME, COALESCE(p.STATE, ''), LEFT(COALESCE(p.INFO, ''), 200),
COALESCE(t.trx_state, ''), COALESCE(t.trx_rows_locked, 0)
FROM information_schema.PROCESSLIST p LEFT JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID
WHERE p.ID <> CONNECTION_ID() AND (p.COMMAND NOT IN ('Sleep', 'Binlog Dump', 'Binlog Dump GTID', 'Daemon') OR t.trx_id IS NOT NULL)
ORDER BY p.ID LIMIT 50`)
	if err != nil {
		s.logger.Debug("read the state database's sessions", zap.Error(err))
		return
	}
	defer rows.Close()
	var sessions []string
	for rows.Next() {
		var (
			id, secs, locked                int64
			command, state, query, trxState string
		)
		if err := rows.Scan(&id, &command, &secs, &state, &query, &trxState, &locked); err != nil {
			s.logger.Debug("read the state database's sessions", zap.Error(err))
			return
		}
		sessions = append(sessions, fmt.Sprintf("%d %s %ds %q trx=%s locked=%d %q", id, command, secs, state, trxState, locked, statementHead(query)))
	}
	if err := rows.Err(); err != nil {
		s.logger.Debug("read the state database's sessions", zap.Error(err))
		return
	}
	s.logger.Info("an enqueue transaction waited over its limit for the one before it; the state database's busy sessions",
		zap.Duration("limit", predecessorWait), zap.Strings("sessions", sessions))
}

// statementHead is the first four words of a statement, each cut at its
// first quote, '=' or '(': "INSERT IGNORE INTO `s`.`claims`" or "UPDATE
// `s`.`leases` l JOIN", never a value ("CHANGE MASTER TO
// MASTER_PASSWORD='…'" is "CHANGE MASTER TO MASTER_PASSWORD").
func statementHead(q string) string {
	words := strings.Fields(q)
	words = words[:min(len(words), 4)]
	for i, w := range words {
		if cut := strings.IndexAny(w, "'\"=("); cut >= 0 {
			words[i] = w[:cut]
		}
	}
	return strings.Join(words, " ")
}
