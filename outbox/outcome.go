package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/sink"
	"github.com/cdcout/cdcout/state"
)

// failLogEvery is how often a pipe logs that deliveries are failing.
const failLogEvery = 5 * time.Second

// logFailure logs a failed delivery with its error at most once per
// failLogEvery per pipe, saying how many failures were left out meanwhile.
func (p *pipeDrainer) logFailure(msg string, n int, errText string, fields ...zap.Field) {
	p.mu.Lock()
	if time.Since(p.failLogAt) < failLogEvery {
		p.failLogged += n
		p.mu.Unlock()
		return
	}
	left := p.failLogged
	p.failLogAt, p.failLogged = time.Now(), 0
	p.mu.Unlock()
	p.log.Warn(msg, append(fields, zap.String("sink", p.sinkName()), zap.Int("rows", n),
		zap.String("error", errText), zap.Int("not_logged_since_last", left))...)
}

// retryDueIn makes the claim loops wake up when a retry delay from now has
// passed rather than at the next idle poll; the slack covers the database
// evaluating NOW(6) after our clock read.
func (p *pipeDrainer) retryDueIn(delay time.Duration) {
	due := time.Now().Add(delay + 5*time.Millisecond)
	p.mu.Lock()
	if due.Before(p.nextDue) || !p.nextDue.After(time.Now()) {
		p.nextDue = due
	}
	p.mu.Unlock()
}

// verdict says what a failed delivery attempt of a record makes of it:
// dead (a permanent error, or the last attempt) or retried after delay (the
// receiver's Retry-After, else the backoff), with the error text to keep.
//
// An overloaded receiver (sink.Overloaded) is not the record's fault: it
// is never dead for it, and the caller gives the attempt back.
func (p *pipeDrainer) verdict(err error, attempt int) (dead bool, delay time.Duration, errText string) {
	errText = truncate(err.Error(), maxErrorLen)
	switch {
	case sink.IsOverloaded(err):
		if ra, ok := sink.RetryAfterOf(err); ok && ra >= 0 {
			return false, ra, errText
		}
		return false, p.d.backoff.Delay(1), errText
	case sink.IsPermanent(err):
		return true, 0, errText
	case attempt >= p.cfg.MaxAttempts:
		return true, 0, truncate(fmt.Sprintf("gave up after %d attempts: %s", attempt, errText), maxErrorLen)
	}
	if ra, ok := sink.RetryAfterOf(err); ok && ra >= 0 {
		return false, ra, errText
	}
	return false, p.d.backoff.Delay(attempt), errText
}

// writeOutcome runs write until it succeeds, for at most retryFor (a
// database restart), and then returns its last error. Each attempt runs
// under a deadline of stmtTimeout (see stmtTimeoutMin), so a blackholed
// state link fails it rather than blocking it until the link heals.
func (p *pipeDrainer) writeOutcome(ctx context.Context, write func(context.Context) error) error {
	deadline := time.Now().Add(p.d.retryFor)
	pause := 100 * time.Millisecond
	for {
		err := p.d.withDeadline(ctx, write)
		if err == nil {
			return nil
		}
		p.d.cfg.Metrics.error(p.name, "record", err)
		if time.Now().After(deadline) {
			return err
		}
		p.log.Warn("record outcome, retrying", zap.Error(err))
		time.Sleep(pause)
		pause = min(pause*2, 5*time.Second)
	}
}

// withDeadline runs one claim-settling write under the statement deadline,
// not cut short by ctx ending (a stop): what it settles was done.
func (d *Drainer) withDeadline(ctx context.Context, write func(context.Context) error) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.stmtTimeout)
	defer cancel()
	return write(wctx)
}

// deliveredAt counts delivered records and observes their commit →
// delivery latency (a zero commit time is not observed).
func (m DrainMetrics) deliveredAt(pipe string, commits []time.Time) {
	if len(commits) == 0 {
		return
	}
	m.delivered(pipe, len(commits))
	if m.Latency == nil {
		return
	}
	now := time.Now()
	for _, t := range commits {
		if !t.IsZero() {
			m.Latency(pipe, now.Sub(t))
		}
	}
}

// outcome is a failed delivery attempt of a row, judged (verdict).
type outcome struct {
	rec      Record
	overload bool // not an attempt: given back
	dead     bool
	delay    time.Duration
	errText  string
}

// keptOutcome is a batch of rows' outcome: delivered rows (with their
// commit times), failed ones judged, and the attempt log entries.
type keptOutcome struct {
	recs      []Record
	delivered []any
	commits   []time.Time
	failed    []outcome
	entries   []attemptEntry
}

// record writes the outcomes of one batch of rows in one transaction. Every
// update is conditional on the row still being claimed by us: if our claim
// lease ran out and another drainer re-claimed the row, our late result
// must not overwrite its state.
//
// When the write fails past its retries, the outcome is kept and written
// by the next claim pass (writeKept) instead of leaving the rows to wait
// out the claim lease on this live process and be delivered again: the
// outcome is known, and "delivered" written late is as true as on time.
func (p *pipeDrainer) record(ctx context.Context, recs []Record, errs []error, took time.Duration) error {
	o := &keptOutcome{recs: recs}
	for i, r := range recs {
		if errs[i] == nil {
			o.delivered, o.commits = append(o.delivered, r.ID), append(o.commits, r.CommitTime)
			continue
		}
		f := outcome{rec: r, overload: sink.IsOverloaded(errs[i])}
		f.dead, f.delay, f.errText = p.verdict(errs[i], r.Attempt)
		o.failed = append(o.failed, f)
	}
	o.entries = p.attemptEntries(recs, o.failed, took)
	if err := p.writeOutcome(ctx, func(wctx context.Context) error { return p.writeRowOutcomes(wctx, o) }); err != nil {
		p.keep(o)
		return fmt.Errorf("record outcome of %d rows of %s (kept, and written on the next claim pass): %w", len(recs), p.name, err)
	}
	p.reportOutcome(o)
	return nil
}

// reportOutcome reports a written outcome (report).
func (p *pipeDrainer) reportOutcome(o *keptOutcome) {
	fails := make([]failure, len(o.failed))
	for i, f := range o.failed {
		fails[i] = failure{id: f.rec.ID, attempt: f.rec.Attempt, dead: f.dead, overload: f.overload, delay: f.delay, errText: f.errText}
	}
	p.report(o.commits, fails)
}

// keep holds an outcome that could not be written for the next claim
// pass. Its rows stay in flight meanwhile: we must not claim them again
// (their claim is ours and stands), and finished leaves them alone.
func (p *pipeDrainer) keep(o *keptOutcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kept = append(p.kept, o)
	for _, r := range o.recs {
		p.inflight[r.ID], p.keptIDs[r.ID] = true, true
	}
}

// writeKept writes the kept outcomes, oldest first, one attempt each; the
// first that fails ends the pass and it and the later ones stay kept.
// The writes stay conditional on our claim: a claim that lapsed meanwhile
// and was taken by another drainer is not touched.
func (p *pipeDrainer) writeKept(ctx context.Context) error {
	p.writingKept.Lock()
	defer p.writingKept.Unlock()
	p.mu.Lock()
	kept := p.kept
	p.kept = nil
	p.mu.Unlock()
	for i, o := range kept {
		if err := p.d.withDeadline(ctx, func(wctx context.Context) error { return p.writeRowOutcomes(wctx, o) }); err != nil {
			p.mu.Lock()
			p.kept = append(kept[i:len(kept):len(kept)], p.kept...)
			p.mu.Unlock()
			p.d.cfg.Metrics.error(p.name, "record", err)
			return fmt.Errorf("record kept outcome of %d rows of %s: %w", len(o.recs), p.name, err)
		}
		p.mu.Lock()
		for _, r := range o.recs {
			delete(p.keptIDs, r.ID)
		}
		p.mu.Unlock()
		p.finished(o.recs)
		p.reportOutcome(o)
		p.log.Info("recorded a kept outcome", zap.Int("rows", len(o.recs)), zap.Int("delivered", len(o.delivered)))
	}
	if len(kept) > 0 {
		p.poke() // the keys' later rows may go now
	}
	return nil
}

// writeRowOutcomes is record's transaction: delivered rows, dead and
// retried ones, and the attempt log.
func (p *pipeDrainer) writeRowOutcomes(ctx context.Context, o *keptOutcome) error {
	d := p.d
	recs, delivered, failed, entries := o.recs, o.delivered, o.failed, o.entries
	tx, err := d.cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if len(delivered) > 0 {
		// next_attempt_at of a done row is when it was done: retention
		// counts from it.
		if _, err := tx.ExecContext(ctx, `UPDATE `+d.outbox+`
SET status = 'delivered', next_attempt_at = NOW(6)
WHERE id IN (`+state.Placeholders(len(delivered))+`) AND status = 'pending' AND claimer = ?`, append(delivered, d.claimer)...); err != nil {
			return fmt.Errorf("mark delivered: %w", err)
		}
	}
	for _, o := range failed {
		if o.dead {
			if _, err := tx.ExecContext(ctx, `UPDATE `+d.outbox+`
SET status = 'dead', next_attempt_at = NOW(6), last_error = ?, last_error_at = NOW(6)
WHERE id = ? AND status = 'pending' AND claimer = ?`, o.errText, o.rec.ID, d.claimer); err != nil {
				return fmt.Errorf("mark dead: %w", err)
			}
			continue
		}
		if _, err := tx.ExecContext(ctx, releaseStatement(d.outbox, `id = ? AND claimer = ?`, true),
			releaseArgs(o.delay, o.overload, o.errText, o.rec.ID, d.claimer)...); err != nil {
			return fmt.Errorf("schedule retry: %w", err)
		}
	}
	if err := d.logAttempts(ctx, tx, entries); err != nil {
		return err
	}
	for _, r := range recs {
		if r.Attempt > d.cfg.AttemptLogCap {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+d.attempt+` WHERE outbox_id = ? AND n <= ?`, r.ID, r.Attempt-d.cfg.AttemptLogCap); err != nil {
				return fmt.Errorf("trim attempt log: %w", err)
			}
		}
	}
	return tx.Commit()
}

// attemptEntry is one row of the attempt log: attempt n of an outbox row,
// how long its call took, and its error (nil for a success).
type attemptEntry struct {
	id      string
	n       int
	took    time.Duration
	errText any
}

// attemptEntries are the attempt log rows of a batch of rows: one for each
// row that has failed at least once (this attempt, or an earlier one:
// failedBefore). An attempt of a row that never failed is already told by
// the outbox row (attempts, status); logging it too cost one more row
// write per delivery on the hot path.
func (p *pipeDrainer) attemptEntries(recs []Record, failed []outcome, took time.Duration) []attemptEntry {
	errText := make(map[string]any, len(failed))
	for _, o := range failed {
		errText[o.rec.ID] = o.errText
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []attemptEntry
	for _, r := range recs {
		if _, failedNow := errText[r.ID]; !failedNow && !p.failedBefore[r.ID] && r.Attempt <= 1 {
			continue
		}
		out = append(out, attemptEntry{id: r.ID, n: r.Attempt, took: took, errText: errText[r.ID]})
	}
	return out
}

// logAttempts writes entries to the attempt log, for rows and for records
// that left a segment alike. A dead-letter retry restarts n at 1, so
// existing numbers are overwritten rather than rejected.
func (d *Drainer) logAttempts(ctx context.Context, tx *sql.Tx, entries []attemptEntry) error {
	if len(entries) == 0 {
		return nil
	}
	vals := make([]string, len(entries))
	args := make([]any, 0, 4*len(entries))
	for i, e := range entries {
		vals[i] = "(?, ?, NOW(6), ?, ?)"
		args = append(args, e.id, e.n, e.took.Microseconds(), e.errText)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+d.attempt+` (outbox_id, n, at, duration_us, error) VALUES `+
		strings.Join(vals, ",")+` ON DUPLICATE KEY UPDATE at = VALUES(at), duration_us = VALUES(duration_us), error = VALUES(error)`, args...); err != nil {
		return fmt.Errorf("log attempts: %w", err)
	}
	return nil
}

// failure is a failed record's recorded outcome, as the metrics and the
// log tell it.
type failure struct {
	id       string
	attempt  int
	dead     bool
	overload bool
	delay    time.Duration
	errText  string
}

// report tells the metrics and the log what a recorded batch came to, rows
// or a segment's records alike: the delivered records' commit times and
// the failures (fields say where they came from). It makes the claim loops
// wake up when the soonest retry is due.
func (p *pipeDrainer) report(commits []time.Time, fails []failure, fields ...zap.Field) {
	m := p.d.cfg.Metrics
	m.deliveredAt(p.name, commits)
	var (
		nRetry, nDead int
		first         *failure
	)
	minDelay := time.Duration(-1)
	for i := range fails {
		f := &fails[i]
		if f.dead {
			nDead++
			p.log.Error("dead-lettered", zap.String("id", f.id), zap.Int("attempt", f.attempt), zap.String("error", f.errText))
			continue
		}
		nRetry++
		if first == nil {
			first = f
		}
		if minDelay < 0 || f.delay < minDelay {
			minDelay = f.delay
		}
	}
	if nRetry > 0 {
		m.retried(p.name, nRetry)
		msg := "delivery failed, will retry"
		if first.overload {
			msg = "delivery failed, receiver overloaded; will retry without counting an attempt"
		}
		p.logFailure(msg, nRetry, first.errText, append(fields, zap.String("id", first.id), zap.Int("attempt", first.attempt),
			zap.Duration("retry_in", first.delay))...)
	}
	if nDead > 0 {
		m.dead(p.name, nDead)
	}
	if minDelay >= 0 {
		p.retryDueIn(minDelay)
	}
	if len(commits) > 0 || nDead > 0 {
		p.d.cfg.Wakes.settled(p)
	}
}

func (m DrainMetrics) batch(pipe string, n int, d time.Duration) {
	if m.Batch != nil {
		m.Batch(pipe, n, d)
	}
}

func (m DrainMetrics) delivered(pipe string, n int) {
	if m.Delivered != nil {
		m.Delivered(pipe, n)
	}
}

func (m DrainMetrics) retried(pipe string, n int) {
	if m.Retried != nil {
		m.Retried(pipe, n)
	}
}

func (m DrainMetrics) dead(pipe string, n int) {
	if m.Dead != nil {
		m.Dead(pipe, n)
	}
}

func (m DrainMetrics) error(pipe, op string, err error) {
	if m.Error != nil {
		m.Error(pipe, op, err)
	}
}

// truncate shortens s to about n bytes, keeping it valid UTF-8 (the column
// is utf8mb4 and a strict server rejects a cut rune).
func truncate(s string, n int) string {
	if len(s) > n {
		s = s[:n] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
