package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/cdcout/cdcout/state"
	"go.uber.org/zap"
)

// A claim is a pending row or segment with a claimer and its next attempt
// moved to the claim's expiry (see pipeDrainer.claim); releasing it is
// the one statement below, whoever releases and why:
//
//   - a drainer that claimed more than it will deliver now (a broken lane,
//     a stop, a failed read-back), giving back the attempt the claim
//     counted;
//   - a failed delivery scheduled for a retry after its backoff, with its
//     error, the attempt kept (or given back for an overloaded receiver);
//   - a stopping process releasing what it claimed and never sent
//     (Store.ReleaseClaimsOf);
//   - a new drain lease holder releasing the claims of replicas that are
//     gone (Store.ReleaseClaimsExcept).
//
// The arguments are, in this order: the delay before the unit is due
// again in microseconds, the attempts given back (0 or 1), the error text
// when withError, then where's own.
func releaseStatement(table, where string, withError bool) string {
	set := `claimer = 0, next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND, attempts = GREATEST(attempts - ?, 0)`
	if withError {
		set += `, last_error = ?, last_error_at = NOW(6)`
	}
	return `UPDATE ` + table + ` SET ` + set + ` WHERE status = 'pending' AND ` + where
}

// releaseArgs are releaseStatement's arguments for a release due after
// delay (giving back one attempt when giveBack) followed by whereArgs.
func releaseArgs(delay time.Duration, giveBack bool, whereArgs ...any) []any {
	back := 0
	if giveBack {
		back = 1
	}
	return append([]any{delay.Microseconds(), back}, whereArgs...)
}

// ReleaseClaimsOf returns to pending, due now, the rows and segments of
// pipes that claimedBy claimed and never handed to a sink, giving back the
// attempt each claim counted, and reports how many it released. A process
// calls it once every drainer of its own has returned: then no delivery of
// its own is in flight, and without it those rows would wait out the claim
// lease (minutes) before another drainer may take them; a pipe's claimed
// segment holds back all its later segments.
func (s *Store) ReleaseClaimsOf(ctx context.Context, claimedBy string, pipes []string) (int64, error) {
	if len(pipes) == 0 {
		return 0, nil
	}
	args := make([]any, 0, len(pipes)+1)
	for _, p := range pipes {
		args = append(args, p)
	}
	args = append(args, ClaimerID(claimedBy))
	where := `pipe IN (` + state.Placeholders(len(pipes)) + `) AND next_attempt_at > NOW(6) AND claimer = ?`
	return s.releaseRowsAndSegments(ctx, where, true, args)
}

// ReleaseClaimsExcept returns to pending, due now, the pipe's rows and
// segments claimed by processes that are not among members (ClaimedBy
// values), so their keys move now instead of after the claim lease; a
// claimed segment holds back every later segment of the pipe. The
// attempts stand: the claimer may have sent them. A paused process that
// resumes may still finish a delivery it had started: a repeat under the
// same delivery key, which at-least-once allows; its outcome write is
// conditional on its claim and matches nothing.
func (s *Store) ReleaseClaimsExcept(ctx context.Context, pipe string, members []string) (int64, error) {
	if len(members) == 0 {
		// Nobody is known to be alive, so nobody is known to be gone.
		return 0, nil
	}
	args := []any{pipe}
	for _, m := range members {
		args = append(args, ClaimerID(m))
	}
	where := `pipe = ? AND next_attempt_at > NOW(6) AND claimer <> 0 AND claimer NOT IN (` + state.Placeholders(len(members)) + `)`
	return s.releaseRowsAndSegments(ctx, where, false, args)
}

// releaseRowsAndSegments releases the claims that where matches in the
// outbox and in the segments. Per pipe a claimed row is a short range of
// the due index (pipe, status, next_attempt_at); a pipe's pending
// segments are few.
func (s *Store) releaseRowsAndSegments(ctx context.Context, where string, giveBack bool, args []any) (int64, error) {
	var n int64
	for _, t := range []struct{ table, what string }{
		{s.outbox + ` FORCE INDEX (due)`, "rows"},
		{s.segments, "segments"},
	} {
		res, err := s.db.ExecContext(ctx, releaseStatement(t.table, where, false), releaseArgs(0, giveBack, args...)...)
		if err != nil {
			return n, fmt.Errorf("release claimed %s: %w", t.what, err)
		}
		m, _ := res.RowsAffected()
		n += m
	}
	return n, nil
}

// release puts claimed rows we will not deliver now back to pending,
// undoing the claim's attempt count, so their keys are not held until the
// claim lease runs out.
func (p *pipeDrainer) release(ctx context.Context, recs []Record) {
	if len(recs) == 0 {
		return
	}
	defer p.finished(recs)
	ids := make([]any, 0, len(recs)+1)
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	ids = append(ids, p.d.claimer)
	// Retried like an outcome write: the usual cause of a failure here is
	// the database restarting between a claim and its read-back, and rows
	// left claimed by a live replica hold their keys until the claim lease
	// ends (minutes; seen in e2e TestChaos as a 2-minute stall).
	deadline := time.Now().Add(p.d.retryFor)
	pause := 100 * time.Millisecond
	for {
		err := p.d.withDeadline(ctx, func(wctx context.Context) error {
			_, err := p.d.cfg.DB.ExecContext(wctx,
				releaseStatement(p.d.outbox, `id IN (`+state.Placeholders(len(recs))+`) AND claimer = ?`, false),
				releaseArgs(0, true, ids...)...)
			return err
		})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			// Left to the claim lease, their keys would wait minutes on
			// this live process: the next claim pass takes them back.
			p.log.Warn("release claimed rows; they are taken back on the next claim pass", zap.Int("rows", len(recs)), zap.Error(err))
			p.mu.Lock()
			for _, r := range recs {
				p.unreleased[r.ID] = true
			}
			p.mu.Unlock()
			return
		}
		p.log.Debug("release claimed rows, retrying", zap.Error(err))
		time.Sleep(pause)
		pause = min(pause*2, 5*time.Second)
	}
}

// releaseIDs releases rows of a claim whose read-back failed: those among
// ids that we claimed and that are not in a delivery of ours.
func (p *pipeDrainer) releaseIDs(ctx context.Context, ids []any) {
	var recs []Record
	p.mu.Lock()
	for _, id := range ids {
		if s, ok := id.(string); ok && !p.inflight[s] {
			recs = append(recs, Record{ID: s})
		}
	}
	p.mu.Unlock()
	p.release(ctx, recs)
}

// takeBackRows gives up the claims of ours a failed release left standing
// (unreleased), giving back the attempt each counted, as the release
// would have. Rows in a delivery of ours are left alone; a row claimed
// anew since is no longer unreleased (claimIDs). Only this process claims
// with its claimer, so a row still claimed by it is in nobody's hands.
func (p *pipeDrainer) takeBackRows(ctx context.Context) error {
	p.mu.Lock()
	n := len(p.unreleased)
	p.mu.Unlock()
	if n == 0 {
		return nil
	}
	p.claiming.Lock()
	defer p.claiming.Unlock()
	var ids []any
	p.mu.Lock()
	for id := range p.unreleased {
		if !p.inflight[id] {
			ids = append(ids, id)
		}
	}
	p.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.d.stmtTimeout)
	defer cancel()
	res, err := p.d.cfg.DB.ExecContext(rctx,
		releaseStatement(p.d.outbox, `id IN (`+state.Placeholders(len(ids))+`) AND claimer = ?`, false),
		releaseArgs(0, true, append(ids, p.d.claimer)...)...)
	if err != nil {
		return fmt.Errorf("take back our claims of %d rows of %s: %w", len(ids), p.name, err)
	}
	p.forgetUnreleased(ids)
	released, _ := res.RowsAffected()
	p.log.Info("took back our own row claims", zap.Int("rows", len(ids)), zap.Int64("released", released))
	return nil
}

// forgetUnreleased drops ids from the claims to take back.
func (p *pipeDrainer) forgetUnreleased(ids []any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		if s, ok := id.(string); ok {
			delete(p.unreleased, s)
		}
	}
}
