package outbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/state"
)

// claimParts split the key space (hex key_hash) between the claimers.
var claimParts = []keyRange{{"", "8"}, {"8", ""}}

// keyRange is a half-open key_hash range; "" is unbounded.
type keyRange struct{ lo, hi string }

var errNoLease = errors.New("drain lease not held")

// drainLease returns the pipe's drain lease when leases are in use
// (fenced), errNoLease when it is not held or no longer locally valid.
func (p *pipeDrainer) drainLease() (l lease.Lease, fenced bool, err error) {
	if p.d.cfg.Leases == nil {
		return lease.Lease{}, false, nil
	}
	l, ok := p.d.cfg.Leases(p.name)
	if !ok || !l.Valid(time.Now()) {
		return lease.Lease{}, false, errNoLease
	}
	return l, true, nil
}

// claimUpdate is the statement that claims what where matches in table (an
// outbox or segments table with its alias): set assigns, in this order,
// the claimer and the claim's length in microseconds. Fenced, the claim
// only happens while the lease row still names us with the same epoch and
// has not expired by the database clock.
func (d *Drainer) claimUpdate(l lease.Lease, fenced bool, table, set, where string, whereArgs []any) (string, []any) {
	args := make([]any, 0, len(whereArgs)+5)
	if !fenced {
		args = append(args, d.claimer, d.cfg.ClaimLease.Microseconds())
		return `UPDATE ` + table + ` SET ` + set + ` WHERE ` + where, append(args, whereArgs...)
	}
	args = append(args, l.Name, d.claimer, d.cfg.ClaimLease.Microseconds())
	args = append(append(args, whereArgs...), l.Holder, l.Epoch)
	return `UPDATE ` + table + ` JOIN ` + d.leases + ` l ON l.name = ? SET ` + set + `
WHERE ` + where + ` AND l.holder = ? AND l.epoch = ? AND l.expires_at > NOW(6)`, args
}

// notBlocked keeps a row only when it is the oldest undelivered row of its
// key: no earlier row of the same (pipe, key_hash) is pending (claimed or
// not). Done rows (delivered, dead) never block; a dead row releases its key.
//
// Cost: per candidate row this probes the key's earlier rows. With only
// by_key (pipe, key_hash, id) the probe walks the key's whole retained
// history, which makes a hot key's rows expensive to claim; an index on
// (pipe, key_hash, status, id) turns it into two short range probes
// (measured: 1,500 pending rows of 10 hot keys, 200-600 ms → 8 ms).
//
// The index is forced: right after a burst of enqueues InnoDB's statistics
// are stale and the optimizer picked the `due` index (matching on pipe
// only), turning one claim over 20k fresh rows into a 17-21 s scan; with
// key_open it takes ~18 ms.
const notBlocked = `NOT EXISTS (SELECT 1 FROM %[1]s e FORCE INDEX (key_open)
  WHERE e.pipe = o.pipe AND e.key_hash = o.key_hash AND e.id < o.id
    AND e.status = 'pending')`

type candidate struct{ id, keyHash string }

// claim claims up to limit due rows of the pipe for this drainer and
// returns them as jobs for the workers. A claim stamps the row with our
// claimer and moves its next_attempt_at to the claim's expiry: until then
// no drainer finds it due, and after it (we died) any drainer does, with no
// separate search for expired claims. The rows it picks are the oldest
// undelivered row of their key (the key's head), so no key has a row in
// flight elsewhere.
//
// When there are few heads (a handful of hot keys with long queues), it also
// claims each head's following rows, up to BatchSize per key, as "lanes" of
// one job: lane i+1 holds the next row of every key whose row in lane i was
// delivered. A hot key then moves one row per Deliver call instead of one
// row per claim round trip, still strictly in order.
func (p *pipeDrainer) claim(ctx context.Context, limit int, part keyRange) ([]job, error) {
	l, fenced, err := p.drainLease()
	if err != nil {
		return nil, err
	}
	// Our own claims that a failed write left standing are settled first:
	// their keys must not wait out the claim lease on a live process.
	if err := p.writeKept(ctx); err != nil {
		return nil, err
	}
	if err := p.takeBackRows(ctx); err != nil {
		return nil, err
	}
	heads, err := p.dueHeads(ctx, limit, part)
	if err != nil {
		return nil, fmt.Errorf("claim %s: find due rows: %w", p.name, err)
	}
	if len(heads) == 0 {
		return nil, nil
	}
	follow, err := p.followers(ctx, heads, limit)
	if err != nil {
		return nil, fmt.Errorf("claim %s: find following rows: %w", p.name, err)
	}
	ids := make([]any, 0, len(heads))
	for _, c := range heads {
		ids = append(ids, c.id)
		for _, id := range follow[c.keyHash] {
			ids = append(ids, id)
		}
	}
	// From the claim on, a stop must not cut us off: rows claimed but never
	// read back would sit out the whole claim lease. The statements are
	// short; a timeout still bounds them.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	p.claiming.RLock()
	got, claimedAt, err := p.claimAndRead(cctx, l, fenced, ids)
	p.claiming.RUnlock()
	if err != nil || got == nil {
		return nil, err
	}
	return p.jobs(cctx, heads, follow, got, claimedAt), nil
}

// claimAndRead claims the rows ids for us and reads back those we got,
// with the time of the claim; nil when we got none. A failure releases
// what we may have claimed.
func (p *pipeDrainer) claimAndRead(cctx context.Context, l lease.Lease, fenced bool, ids []any) (map[string]Record, time.Time, error) {
	if n, err := p.claimIDs(cctx, l, fenced, ids); err != nil || n == 0 {
		// n == 0: taken by another drainer meanwhile, or (fenced) our
		// lease is no longer current in the database.
		return nil, time.Time{}, err
	}
	claimedAt := time.Now()
	got, err := p.readClaimed(cctx, ids)
	if err != nil {
		// If the release fails too, the next claim pass takes the
		// claims back.
		p.releaseIDs(cctx, ids)
		return nil, time.Time{}, fmt.Errorf("claim %s: read claimed rows: %w", p.name, err)
	}
	return got, claimedAt, nil
}

// dueHeads finds up to limit due rows of the pipe in part of the key space
// that are the oldest undelivered row of their key, one per key, none in
// a delivery of ours.
func (p *pipeDrainer) dueHeads(ctx context.Context, limit int, part keyRange) ([]candidate, error) {
	d := p.d
	rng, args := "", []any{p.name}
	if part.lo != "" {
		rng += ` AND o.key_hash >= ?`
		args = append(args, part.lo)
	}
	if part.hi != "" {
		rng += ` AND o.key_hash < ?`
		args = append(args, part.hi)
	}
	rows, err := d.cfg.DB.QueryContext(ctx, `SELECT o.id, o.key_hash FROM `+d.outbox+` o
WHERE o.pipe = ? AND o.status = 'pending' AND o.next_attempt_at <= NOW(6)`+rng+` AND `+fmt.Sprintf(notBlocked, d.outbox)+`
ORDER BY o.next_attempt_at, o.id LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cands []candidate
	seen := map[string]bool{}
	for rows.Next() {
		var c candidate
		if err := rows.Scan(&c.id, &c.keyHash); err != nil {
			return nil, err
		}
		if seen[c.keyHash] || p.isInflight(c.id) {
			continue
		}
		seen[c.keyHash] = true
		cands = append(cands, c)
	}
	return cands, rows.Err()
}

// claimIDs claims the rows ids for us and reports how many it claimed.
// The row conditions are re-checked here: between the SELECT and this
// UPDATE another drainer may have claimed a row, and then it matches
// nothing. The primary key is forced: it locks the rows named and no gap,
// where the `due` index (matching on pipe, which the optimizer has
// picked on stale statistics, see notBlocked) would lock the range up
// to the next record, and that may be a row another transaction is
// inserting (the janitor's claim sweep waited that way on an enqueue's
// claims and stalled it).
func (p *pipeDrainer) claimIDs(ctx context.Context, l lease.Lease, fenced bool, ids []any) (int64, error) {
	d := p.d
	q, args := d.claimUpdate(l, fenced, d.outbox+` o FORCE INDEX (PRIMARY)`,
		`o.claimer = ?, o.next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND, o.attempts = o.attempts + 1`,
		`o.pipe = ? AND o.id IN (`+state.Placeholders(len(ids))+`) AND o.status = 'pending' AND o.next_attempt_at <= NOW(6)`,
		append([]any{p.name}, ids...))
	// Claimed anew, a row is no longer a stuck claim of an earlier pass.
	p.forgetUnreleased(ids)
	res, err := d.cfg.DB.ExecContext(ctx, q, args...)
	if err != nil {
		// The server may have committed the claim and lost the answer (it
		// restarted): release whatever of ids is claimed by us, a no-op
		// when the claim never happened.
		p.releaseIDs(ctx, ids)
		return 0, fmt.Errorf("claim %s: %w", p.name, err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// readClaimed reads back the rows of ids that we claimed, marks them in
// flight and returns them by id. A row already in a delivery of ours is
// left out.
func (p *pipeDrainer) readClaimed(ctx context.Context, ids []any) (map[string]Record, error) {
	d := p.d
	rows, err := d.cfg.DB.QueryContext(ctx, `SELECT id, sink, db, tbl, op, row_key, attempts, commit_ts, payload, last_error IS NOT NULL
FROM `+d.outbox+` WHERE id IN (`+state.Placeholders(len(ids))+`) AND status = 'pending' AND claimer = ?
ORDER BY id`, append(ids, d.claimer)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := map[string]Record{}
	failed := map[string]bool{}
	for rows.Next() {
		var (
			r   Record
			op  string
			ct  sqlTime
			bad bool
		)
		if err := rows.Scan(&r.ID, &r.Sink, &r.DB, &r.Table, &op, &r.Key, &r.Attempt, &ct, &r.Payload, &bad); err != nil {
			return nil, err
		}
		r.Pipe, r.Op, r.CommitTime = p.name, canonical.Op(op), ct.T
		got[r.ID], failed[r.ID] = r, bad
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range got {
		if p.inflight[id] {
			delete(got, id)
			continue
		}
		p.inflight[id] = true
		if failed[id] {
			p.failedBefore[id] = true
		}
	}
	return got, nil
}

// jobs turns the claimed rows got into jobs for the workers. A key's rows
// must be claimed contiguously from its head: a following row we did not
// get (another drainer took it meanwhile) ends the key's run there, and
// the rows after it are released.
func (p *pipeDrainer) jobs(ctx context.Context, heads []candidate, follow map[string][]string, got map[string]Record, claimedAt time.Time) []job {
	var (
		lanes   [][]Record
		release []Record
	)
	for _, c := range heads {
		seq := append([]string{c.id}, follow[c.keyHash]...)
		broken := false
		for i, id := range seq {
			r, ok := got[id]
			switch {
			case !ok:
				broken = true
			case broken:
				release = append(release, r)
			default:
				for len(lanes) <= i {
					lanes = append(lanes, nil)
				}
				lanes[i] = append(lanes[i], r)
			}
		}
	}
	if len(release) > 0 {
		p.release(ctx, release)
	}
	if len(lanes) == 0 {
		return nil
	}
	if len(lanes) > 1 {
		return []job{{lanes: lanes, claimedAt: claimedAt}}
	}
	// Only heads: one job per batch, so batches run concurrently.
	var jobs []job
	for recs := lanes[0]; len(recs) > 0; {
		n := min(len(recs), p.cfg.BatchSize)
		jobs = append(jobs, job{lanes: [][]Record{recs[:n:n]}, claimedAt: claimedAt})
		recs = recs[n:]
	}
	return jobs
}

// maxRunKeys: runs are only worth their extra query when few keys have
// work; with many distinct heads a claim is full of parallel work already.
const maxRunKeys = 64

// followers returns, for claims with few heads, up to BatchSize pending ids
// that follow each head in its key (in id order), cut at the first one that
// is not due (claimed elsewhere, or waiting for a retry): all of a key's
// rows after its head are normally pending and never attempted, and
// anything else ends the run rather than being jumped. Done rows (a dead
// row sent back by `dead retry` can have delivered rows after it) do not
// block their key and are passed over.
func (p *pipeDrainer) followers(ctx context.Context, heads []candidate, limit int) (map[string][]string, error) {
	if len(heads) > maxRunKeys || len(heads) >= limit {
		return nil, nil
	}
	per := min(p.cfg.BatchSize, (limit-len(heads))/len(heads))
	if per < 1 {
		return nil, nil
	}
	d := p.d
	parts := make([]string, len(heads))
	args := make([]any, 0, 4*len(heads))
	for i, h := range heads {
		parts[i] = `(SELECT id, key_hash, next_attempt_at <= NOW(6) FROM ` + d.outbox + `
WHERE pipe = ? AND key_hash = ? AND status = 'pending' AND id > ? ORDER BY id LIMIT ?)`
		args = append(args, p.name, h.keyHash, h.id, per)
	}
	rows, err := d.cfg.DB.QueryContext(ctx, strings.Join(parts, " UNION ALL "), args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	type row struct {
		id  string
		due bool
	}
	byKey := map[string][]row{}
	for rows.Next() {
		var (
			r  row
			kh string
		)
		if err := rows.Scan(&r.id, &kh, &r.due); err != nil {
			return nil, err
		}
		byKey[kh] = append(byKey[kh], r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for kh, rs := range byKey {
		// UNION ALL keeps each part's order only by accident; sort.
		sort.Slice(rs, func(i, j int) bool { return rs[i].id < rs[j].id })
		for _, r := range rs {
			if !r.due || p.isInflight(r.id) {
				break
			}
			out[kh] = append(out[kh], r.id)
		}
	}
	return out, nil
}

func (p *pipeDrainer) isInflight(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight[id]
}
