package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/sink"
	"github.com/cdcout/cdcout/state"
)

// Drainer defaults. A pipe's are the sink defaults the configuration
// documents (config.DefaultSink…), so a Drainer built without a config
// behaves as a configured sink that sets nothing.
const (
	DefaultClaimLease    = 5 * time.Minute
	DefaultTimeout       = config.DefaultSinkTimeout
	DefaultMaxAttempts   = config.DefaultSinkMaxAttempts
	DefaultConcurrency   = config.DefaultSinkConcurrency
	DefaultBatchSize     = config.DefaultSinkBatchSize
	DefaultBackoffBase   = 200 * time.Millisecond
	DefaultBackoffCap    = 5 * time.Minute
	DefaultAttemptLogCap = 20

	idleMin = 50 * time.Millisecond
	idleMax = 2 * time.Second
	// outcomeRetryFor bounds how long a delivered batch's outcome write is
	// retried (database restart) before the rows are left to their claim
	// lease, which re-delivers them under the same deliveryKey.
	outcomeRetryFor = 30 * time.Second
	maxErrorLen     = 4096
)

// PipeConfig is how one pipe is delivered.
type PipeConfig struct {
	Sink Sink
	// Timeout bounds one delivery attempt; the sink's context is cancelled
	// when it passes. Default 10s.
	Timeout time.Duration
	// MaxAttempts: a row whose attempt count reaches it is dead-lettered.
	// Default DefaultMaxAttempts (25).
	MaxAttempts int
	// Concurrency is how many batches of this pipe are in flight at once.
	// Default 8.
	Concurrency int
	// BatchSize is the most records handed to one Deliver call. Default 100.
	BatchSize int
}

// DrainMetrics are optional observation hooks; nil fields are skipped.
type DrainMetrics struct {
	// Batch is called after every Deliver call with its size and duration.
	Batch func(pipe string, n int, d time.Duration)
	// Delivered, Retried and Dead count outcomes.
	Delivered func(pipe string, n int)
	Retried   func(pipe string, n int)
	Dead      func(pipe string, n int)
	// Latency observes each delivered record's source commit → delivery time.
	Latency func(pipe string, d time.Duration)
	// Error is called when claiming or recording an outcome fails
	// (op is "claim" or "record").
	Error func(pipe, op string, err error)
}

// DrainerConfig configures a Drainer.
type DrainerConfig struct {
	DB     *sql.DB
	Schema string
	// ClaimedBy identifies this drainer: every row it claims carries
	// ClaimerID(ClaimedBy), and outcome writes are conditional on it. Required: it must be unique per process boot
	// ("<replica-id>/<nonce>") so a restarted replica never mistakes a claim
	// it died inside for a live one of its own.
	ClaimedBy string
	// ClaimLease is how long a claim stands before another drainer may take
	// the row. It must exceed every pipe's Timeout, or a slow delivery would
	// be handed to a second drainer while still running. Default 5 min.
	ClaimLease time.Duration
	Pipes      map[string]PipeConfig
	// BackoffBase (default 200ms) and BackoffCap (default 5 min) shape the
	// retry delay: base × 2^(attempt-1), full jitter, capped.
	BackoffBase time.Duration
	BackoffCap  time.Duration
	// AttemptLogCap is how many attempt rows are kept per outbox row.
	AttemptLogCap int
	Logger        *zap.Logger
	Metrics       DrainMetrics
	// Leases returns the drain lease this replica holds for a pipe. When
	// set, a pipe is drained only while its lease is held and locally
	// valid, and every claim is conditional on the lease's holder and epoch
	// in the database, so a paused former holder claims nothing. Nil means
	// every configured pipe is drained unfenced (single replica, tests).
	Leases func(pipe string) (lease.Lease, bool)
}

// Drainer delivers outbox rows to sinks: per pipe, it claims due rows,
// delivers them in batches with bounded concurrency and records each
// outcome. Within a pipe, rows of one key are delivered in commit order and
// a failing row delays only its own key (DESIGN.md, Invariant 5).
type Drainer struct {
	cfg      DrainerConfig
	claimer  int64 // ClaimerID(cfg.ClaimedBy)
	outbox   string
	segments string
	attempt  string
	leases   string
	backoff  Backoff
	logger   *zap.Logger
	pipes    []*pipeDrainer
}

type pipeDrainer struct {
	d    *Drainer
	name string
	cfg  PipeConfig
	// wake has one channel per claimer; a poke wakes them all.
	wake []chan struct{}
	log  *zap.Logger

	mu       sync.Mutex
	inflight map[string]bool // ids of rows in a Deliver call right now
	// failedBefore marks in-flight rows that carry an earlier error (a
	// retry, or a dead letter sent back): their attempts are logged even
	// when this one succeeds, so the log never ends on a stale failure.
	failedBefore map[string]bool
	nextDue      time.Time // earliest local time a retried row becomes due
	// stuck is a segment claim of ours that a failed write left behind
	// (release, hold or outcome): the next segment pass takes it back
	// rather than wait out the claim lease (segdrain.go).
	stuck *stuckClaim
	// failLog rate-limits the "delivery failed" lines: an outage must not
	// flood the log.
	failLogAt  time.Time
	failLogged int // failures left out of the log since failLogAt

	// bg counts the outcome writers of stalled calls a segment did not
	// wait for (finishDetached); the pipe's drain waits for them.
	bg sync.WaitGroup
}

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

// sinkName is the sink part of the pipe's name.
func (p *pipeDrainer) sinkName() string {
	if i := strings.LastIndexByte(p.name, ':'); i >= 0 {
		return p.name[i+1:]
	}
	return p.name
}

// paced reports whether the pipe's sink paces itself (see Paced).
func (p *pipeDrainer) paced() bool {
	ps, ok := p.cfg.Sink.(Paced)
	return ok && ps.Paced()
}

// callContext is the context of one Deliver call of work claimed at
// claimedAt: the pipe's Timeout for ordinary sinks (not cut short by a
// stop: calls under way finish); for paced sinks, until the drainer stops
// or half the claim lease has passed, whichever is first.
func (p *pipeDrainer) callContext(stop context.Context, claimedAt time.Time) (context.Context, context.CancelFunc) {
	if !p.paced() {
		return context.WithTimeout(context.WithoutCancel(stop), p.cfg.Timeout)
	}
	return context.WithDeadline(stop, claimedAt.Add(p.d.cfg.ClaimLease/2))
}

// NewDrainer validates cfg, fills defaults and returns a Drainer.
func NewDrainer(cfg DrainerConfig) (*Drainer, error) {
	if cfg.DB == nil {
		return nil, errors.New("drainer: DB is nil")
	}
	if cfg.ClaimedBy == "" {
		return nil, errors.New("drainer: ClaimedBy is required (the replica id plus a per-boot nonce): without it every replica would deliver every row")
	}
	if err := state.CheckName(cfg.Schema); err != nil {
		return nil, fmt.Errorf("drainer: %w", err)
	}
	if cfg.ClaimLease == 0 {
		cfg.ClaimLease = DefaultClaimLease
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffCap <= 0 {
		cfg.BackoffCap = DefaultBackoffCap
	}
	if cfg.AttemptLogCap <= 0 {
		cfg.AttemptLogCap = DefaultAttemptLogCap
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	d := &Drainer{
		cfg:      cfg,
		claimer:  ClaimerID(cfg.ClaimedBy),
		outbox:   state.Table(cfg.Schema, "outbox"),
		segments: state.Table(cfg.Schema, "segments"),
		attempt:  state.Table(cfg.Schema, "attempts"),
		leases:   state.Table(cfg.Schema, "leases"),
		backoff:  Backoff{Base: cfg.BackoffBase, Cap: cfg.BackoffCap},
		logger:   cfg.Logger.Named("drain"),
	}
	names := make([]string, 0, len(cfg.Pipes))
	for name := range cfg.Pipes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		pc := cfg.Pipes[name]
		if pc.Sink == nil {
			return nil, fmt.Errorf("drainer: pipe %s has no sink", name)
		}
		if pc.Timeout <= 0 {
			pc.Timeout = DefaultTimeout
		}
		if pc.MaxAttempts <= 0 {
			pc.MaxAttempts = DefaultMaxAttempts
		}
		if pc.Concurrency <= 0 {
			pc.Concurrency = DefaultConcurrency
		}
		if pc.BatchSize <= 0 {
			pc.BatchSize = DefaultBatchSize
		}
		if cfg.ClaimLease <= pc.Timeout {
			return nil, fmt.Errorf("drainer: claim lease %v must exceed pipe %s's delivery timeout %v, or a slow delivery is handed to a second replica while it is still running", cfg.ClaimLease, name, pc.Timeout)
		}
		d.pipes = append(d.pipes, &pipeDrainer{
			d: d, name: name, cfg: pc,
			// One wake channel per claimer, the last for segments.
			wake:     []chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)},
			log:      d.logger.With(zap.String("pipe", name)),
			inflight: map[string]bool{},

			failedBefore: map[string]bool{},
		})
	}
	return d, nil
}

// Wake makes every pipe look for due rows now; the enqueuer calls it after
// a commit so delivery latency is not a polling interval.
func (d *Drainer) Wake() {
	for _, p := range d.pipes {
		p.poke()
	}
}

func (p *pipeDrainer) poke() {
	for _, w := range p.wake {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

// Run drains every pipe until ctx ends, then stops claiming, lets the
// deliveries in flight finish (each bounded by its timeout), records their
// outcomes and returns nil.
func (d *Drainer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, p := range d.pipes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.run(ctx)
		}()
	}
	wg.Wait()
	return nil
}

// DrainOnce does one pass over every pipe: it claims up to Concurrency
// batches per pipe, delivers them and records the outcomes. n is the number
// of rows attempted. For tests and tools; Run is the service loop.
func (d *Drainer) DrainOnce(ctx context.Context) (int, error) {
	total := 0
	var (
		mu   sync.Mutex
		errs []error
	)
	for _, p := range d.pipes {
		for {
			n, err := p.drainSegment(ctx)
			total += n
			if err != nil && !errors.Is(err, errNoLease) {
				errs = append(errs, err)
			}
			if err != nil || n == 0 {
				break
			}
		}
		var (
			jobs []job
			err  error
			rows int
		)
		for rows < p.cfg.Concurrency*p.cfg.BatchSize {
			var js []job
			js, err = p.claim(ctx, p.cfg.Concurrency*p.cfg.BatchSize-rows, keyRange{})
			if err != nil || len(js) == 0 {
				break
			}
			for _, j := range js {
				rows += j.size()
			}
			jobs = append(jobs, js...)
		}
		if err != nil && !errors.Is(err, errNoLease) {
			errs = append(errs, err)
		}
		total += rows
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.runJob(ctx, ctx, j); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		p.bg.Wait()
	}
	return total, errors.Join(errs...)
}

// run is one pipe's service loop: claimers keep up to 2 × Concurrency
// batches claimed ahead (several batches per statement), and Concurrency
// workers deliver them.
func (p *pipeDrainer) run(ctx context.Context) {
	work := make(chan job, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for range p.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				// Outcomes are recorded even while shutting down: the
				// delivery happened, and the claim must not be left to
				// expire into a redelivery.
				if err := p.runJob(context.WithoutCancel(ctx), ctx, j); err != nil {
					p.log.Error("record outcome", zap.Error(err))
				}
				// A finished row may unblock the next row of its key, and
				// frees room for more claims; a claimer that may not claim
				// yet (see claimLoop) is not woken for nothing.
				if p.mayClaim() {
					p.poke()
				}
			}
		}()
	}
	defer func() {
		close(work)
		wg.Wait()
		p.bg.Wait()
	}()

	// Claiming is the serial part of draining, so two claimers share it,
	// each owning half of the key space (by key_hash): keys never cross
	// claimers, so per-key order is each claimer's own affair.
	var cw sync.WaitGroup
	cw.Add(1)
	go func() {
		defer cw.Done()
		p.segmentLoop(ctx, p.wake[len(claimParts)])
	}()
	for i, part := range claimParts {
		cw.Add(1)
		go func() {
			defer cw.Done()
			p.claimLoop(ctx, i, part, work)
		}()
	}
	cw.Wait()
}

// maxOutstanding bounds the rows a pipe has claimed and not yet finished.
func (p *pipeDrainer) maxOutstanding() int { return 2 * p.cfg.Concurrency * p.cfg.BatchSize }

// roomFor reports whether a claimer with inflight rows outstanding claims
// now. A claim's statements cost about the same for 50 rows as for 800, so
// while deliveries are in flight it waits until half the window is free
// rather than claiming after every finished batch; an idle pipe claims at
// once.
func (p *pipeDrainer) roomFor(inflight int) bool {
	room := p.maxOutstanding() - inflight
	return room >= p.cfg.BatchSize && (inflight == 0 || room >= p.maxOutstanding()/2)
}

func (p *pipeDrainer) mayClaim() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.roomFor(len(p.inflight))
}

// claimParts split the key space (hex key_hash) between the claimers.
var claimParts = []keyRange{{"", "8"}, {"8", ""}}

// keyRange is a half-open key_hash range; "" is unbounded.
type keyRange struct{ lo, hi string }

func (p *pipeDrainer) claimLoop(ctx context.Context, i int, part keyRange, work chan<- job) {
	maxOutstanding := p.maxOutstanding()
	perClaim := max(p.cfg.BatchSize, p.cfg.Concurrency*p.cfg.BatchSize/len(claimParts))
	idle := idleMin
	timer := time.NewTimer(idle)
	defer timer.Stop()
	failing := false
	for ctx.Err() == nil {
		p.mu.Lock()
		inflight := len(p.inflight)
		p.mu.Unlock()
		room := maxOutstanding - inflight
		var (
			jobs []job
			err  error
		)
		if p.roomFor(inflight) {
			jobs, err = p.claim(ctx, min(room, perClaim), part)
		}
		if len(jobs) > 0 {
			idle, failing = idleMin, false
			// Claimed rows are always handed to a worker, even when ctx
			// ends meanwhile: left undelivered they would hold their keys
			// until the claim lease ran out. (A job's later lanes are
			// released instead once ctx ends.)
			for _, j := range jobs {
				work <- j
			}
			continue
		}
		if err == nil {
			failing = false
		}
		if err != nil && !errors.Is(err, errNoLease) && ctx.Err() == nil {
			if !failing {
				p.log.Warn("claim rows", zap.Error(err))
			}
			failing = true
			p.d.cfg.Metrics.error(p.name, "claim", err)
			idle = idleMax
		}
		timer.Reset(p.idleWait(idle))
		select {
		case <-ctx.Done():
		case <-p.wake[i]:
			idle = idleMin
		case <-timer.C:
			if room >= p.cfg.BatchSize {
				idle = min(idle*2, idleMax)
			}
		}
	}
}

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

// idleWait is how long a claim loop that found nothing sleeps: idle, or
// less when a retry falls due sooner.
func (p *pipeDrainer) idleWait(idle time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A due time already passed was served by a claim since.
	if until := time.Until(p.nextDue); until > 0 && until < idle {
		return until
	}
	return idle
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

// writeOutcome runs write until it succeeds, for at most outcomeRetryFor
// (a database restart), and then returns its last error: what was
// delivered is left to its claim lease and delivered again under the same
// deliveryKey.
func (p *pipeDrainer) writeOutcome(write func() error) error {
	deadline := time.Now().Add(outcomeRetryFor)
	pause := 100 * time.Millisecond
	for {
		err := write()
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

// segmentLoop delivers the pipe's segments one after the other, and waits
// for a wake-up or a poll when there is none.
func (p *pipeDrainer) segmentLoop(ctx context.Context, wake <-chan struct{}) {
	idle := idleMin
	timer := time.NewTimer(idle)
	defer timer.Stop()
	failing := false
	for ctx.Err() == nil {
		n, err := p.drainSegment(ctx)
		switch {
		case err == nil && n > 0:
			idle, failing = idleMin, false
			continue
		case err == nil:
			failing = false
		case !errors.Is(err, errNoLease) && ctx.Err() == nil:
			if !failing {
				p.log.Warn("drain segments", zap.Error(err))
			}
			failing = true
			p.d.cfg.Metrics.error(p.name, "claim", err)
			idle = idleMax
		}
		timer.Reset(p.idleWait(idle)) // a held segment's retry, too
		select {
		case <-ctx.Done():
		case <-wake:
			idle = idleMin
		case <-timer.C:
			idle = min(idle*2, idleMax)
		}
	}
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
	d := p.d
	l, fenced, err := p.drainLease()
	if err != nil {
		return nil, err
	}
	var cands []candidate
	seen := map[string]bool{}
	add := func(q string, args ...any) error {
		rows, err := d.cfg.DB.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c candidate
			if err := rows.Scan(&c.id, &c.keyHash); err != nil {
				return err
			}
			if seen[c.keyHash] || p.isInflight(c.id) {
				continue
			}
			seen[c.keyHash] = true
			cands = append(cands, c)
		}
		return rows.Err()
	}
	nb := fmt.Sprintf(notBlocked, d.outbox)
	{
		var (
			rng  string
			args = []any{p.name}
		)
		if part.lo != "" {
			rng += ` AND o.key_hash >= ?`
			args = append(args, part.lo)
		}
		if part.hi != "" {
			rng += ` AND o.key_hash < ?`
			args = append(args, part.hi)
		}
		args = append(args, limit)
		if err := add(`SELECT o.id, o.key_hash FROM `+d.outbox+` o
WHERE o.pipe = ? AND o.status = 'pending' AND o.next_attempt_at <= NOW(6)`+rng+` AND `+nb+`
ORDER BY o.next_attempt_at, o.id LIMIT ?`, args...); err != nil {
			return nil, fmt.Errorf("claim %s: find due rows: %w", p.name, err)
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	follow, err := p.followers(ctx, cands, limit)
	if err != nil {
		return nil, fmt.Errorf("claim %s: find following rows: %w", p.name, err)
	}
	ids := make([]any, 0, len(cands))
	for _, c := range cands {
		ids = append(ids, c.id)
		for _, id := range follow[c.keyHash] {
			ids = append(ids, id)
		}
	}
	in := state.Placeholders(len(ids))
	// The row conditions are re-checked here: between the SELECT and this
	// UPDATE another drainer may have claimed a row, and then it matches
	// nothing.
	q, args := d.claimUpdate(l, fenced, d.outbox+` o`,
		`o.claimer = ?, o.next_attempt_at = NOW(6) + INTERVAL ? MICROSECOND, o.attempts = o.attempts + 1`,
		`o.pipe = ? AND o.id IN (`+in+`) AND o.status = 'pending' AND o.next_attempt_at <= NOW(6)`,
		append([]any{p.name}, ids...))
	// From the claim on, a stop must not cut us off: rows claimed but never
	// read back would sit out the whole claim lease. The statements are
	// short; a timeout still bounds them.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	res, err := d.cfg.DB.ExecContext(cctx, q, args...)
	if err != nil {
		// The server may have committed the claim and lost the answer (it
		// restarted): release whatever of ids is claimed by us, a no-op
		// when the claim never happened.
		p.releaseIDs(cctx, ids)
		return nil, fmt.Errorf("claim %s: %w", p.name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		// Taken by another drainer meanwhile, or (fenced) our lease is no
		// longer current in the database.
		return nil, nil
	}
	rows, err := d.cfg.DB.QueryContext(cctx, `SELECT id, sink, db, tbl, op, row_key, attempts, commit_ts, payload, last_error IS NOT NULL
FROM `+d.outbox+` WHERE id IN (`+in+`) AND status = 'pending' AND claimer = ?
ORDER BY id`, append(ids, d.claimer)...)
	if err != nil {
		// If the release fails too, the claims stand until the claim
		// lease ends and are re-claimed then.
		p.releaseIDs(cctx, ids)
		return nil, fmt.Errorf("claim %s: read claimed rows: %w", p.name, err)
	}
	defer rows.Close()
	claimedAt := time.Now()
	got := map[string]Record{}
	p.mu.Lock()
	for rows.Next() {
		var (
			r      Record
			op     string
			ct     sqlTime
			failed bool
		)
		if err := rows.Scan(&r.ID, &r.Sink, &r.DB, &r.Table, &op, &r.Key, &r.Attempt, &ct, &r.Payload, &failed); err != nil {
			p.mu.Unlock()
			p.releaseIDs(cctx, ids)
			return nil, fmt.Errorf("claim %s: read claimed rows: %w", p.name, err)
		}
		if p.inflight[r.ID] {
			continue
		}
		r.Pipe, r.Op, r.CommitTime = p.name, canonical.Op(op), ct.T
		got[r.ID] = r
		if failed {
			p.failedBefore[r.ID] = true
		}
	}
	if err := rows.Err(); err != nil {
		p.mu.Unlock()
		p.releaseIDs(cctx, ids)
		return nil, fmt.Errorf("claim %s: read claimed rows: %w", p.name, err)
	}
	for id := range got {
		p.inflight[id] = true
	}
	p.mu.Unlock()

	// Lanes: a key's rows must be claimed contiguously from its head. A
	// following row we did not get (another drainer took it meanwhile)
	// ends the key's run there, and the rows after it are released.
	var (
		lanes   [][]Record
		release []Record
	)
	for _, c := range cands {
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
		p.release(cctx, release)
	}
	if len(lanes) == 0 {
		return nil, nil
	}
	if len(lanes) == 1 {
		// Only heads: one job per batch, so batches run concurrently.
		var jobs []job
		for recs := lanes[0]; len(recs) > 0; {
			n := min(len(recs), p.cfg.BatchSize)
			jobs = append(jobs, job{lanes: [][]Record{recs[:n:n]}, claimedAt: claimedAt})
			recs = recs[n:]
		}
		return jobs, nil
	}
	return []job{{lanes: lanes, claimedAt: claimedAt}}, nil
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

// release puts claimed rows we will not deliver now back to pending,
// undoing the claim's attempt count, so their keys are not held until the
// claim lease runs out.
func (p *pipeDrainer) release(ctx context.Context, recs []Record) {
	if len(recs) == 0 {
		return
	}
	defer func() {
		p.mu.Lock()
		for _, r := range recs {
			delete(p.inflight, r.ID)
			delete(p.failedBefore, r.ID)
		}
		p.mu.Unlock()
	}()
	ids := make([]any, 0, len(recs)+1)
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	ids = append(ids, p.d.claimer)
	// Retried like an outcome write: the usual cause of a failure here is
	// the database restarting between a claim and its read-back, and rows
	// left claimed by a live replica hold their keys until the claim lease
	// ends (minutes; seen in e2e TestChaos as a 2-minute stall).
	deadline := time.Now().Add(outcomeRetryFor)
	pause := 100 * time.Millisecond
	for {
		_, err := p.d.cfg.DB.ExecContext(context.WithoutCancel(ctx),
			releaseStatement(p.d.outbox, `id IN (`+state.Placeholders(len(recs))+`) AND claimer = ?`, false),
			releaseArgs(0, true, ids...)...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			// They are re-claimed when the claim lease ends.
			p.log.Warn("release claimed rows", zap.Int("rows", len(recs)), zap.Error(err))
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

// A job is one worker's share of a claim: lanes delivered one after the
// other (see claim).
type job struct {
	lanes     [][]Record
	claimedAt time.Time
}

func (j job) size() int {
	n := 0
	for _, l := range j.lanes {
		n += len(l)
	}
	return n
}

// leaseHeld reports whether this pipe's drain lease (if leases are used) is
// still held and locally valid.
func (p *pipeDrainer) leaseHeld() bool {
	if p.d.cfg.Leases == nil {
		return true
	}
	l, ok := p.d.cfg.Leases(p.name)
	return ok && l.Valid(time.Now())
}

// runJob delivers a job's lanes in order. A key whose row failed (retry or
// dead) has its later rows released. Lanes stop, and the rest is released,
// once stop ends (shutdown), the drain lease is lost (the next holder should
// not wait for our run) or half the claim lease has passed (a slow sink must
// not hold claims until they expire under us).
func (p *pipeDrainer) runJob(ctx, stop context.Context, j job) error {
	failed := map[string]bool{}
	var errs []error
	for li, lane := range j.lanes {
		if li > 0 && (stop.Err() != nil || time.Since(j.claimedAt) > p.d.cfg.ClaimLease/2 || !p.leaseHeld()) {
			var rest []Record
			for _, l := range j.lanes[li:] {
				rest = append(rest, l...)
			}
			p.release(ctx, rest)
			break
		}
		var todo, skip []Record
		for _, r := range lane {
			if failed[r.Key] {
				skip = append(skip, r)
			} else {
				todo = append(todo, r)
			}
		}
		p.release(ctx, skip)
		for len(todo) > 0 {
			n := min(len(todo), p.cfg.BatchSize)
			chunk := todo[:n:n]
			todo = todo[n:]
			res, err := p.deliverAndRecord(ctx, stop, j.claimedAt, chunk)
			if err != nil {
				errs = append(errs, err)
			}
			for i, r := range chunk {
				if err != nil || res[i] != nil {
					failed[r.Key] = true
				}
			}
		}
	}
	return errors.Join(errs...)
}

func (p *pipeDrainer) isInflight(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inflight[id]
}

// deliverAndRecord hands one batch to the sink and records every outcome.
func (p *pipeDrainer) deliverAndRecord(ctx, stop context.Context, claimedAt time.Time, recs []Record) ([]error, error) {
	defer func() {
		p.mu.Lock()
		for _, r := range recs {
			delete(p.inflight, r.ID)
			delete(p.failedBefore, r.ID)
		}
		p.mu.Unlock()
	}()
	dctx, cancel := p.callContext(stop, claimedAt)
	start := time.Now()
	errs := p.deliver(dctx, recs)
	dur := time.Since(start)
	if dctx.Err() != nil && !p.paced() {
		// The sink returned after its deadline; an error it reports as a
		// plain context error is a timeout, and says so.
		for i, err := range errs {
			if err != nil && errors.Is(err, context.DeadlineExceeded) {
				errs[i] = fmt.Errorf("delivery timed out after %v: %w", p.cfg.Timeout, err)
			}
		}
	}
	cancel()
	p.d.cfg.Metrics.batch(p.name, len(recs), dur)
	return errs, p.record(ctx, recs, errs, dur)
}

// deliver calls the sink, turning a panic or a short result into errors so
// one misbehaving sink cannot take the drainer down or lose an outcome.
func (p *pipeDrainer) deliver(ctx context.Context, recs []Record) (errs []error) {
	defer func() {
		if v := recover(); v != nil {
			p.log.Error("sink panicked", zap.Any("panic", v))
			errs = make([]error, len(recs))
			for i := range errs {
				errs[i] = fmt.Errorf("sink panicked: %v", v)
			}
		}
	}()
	got := p.cfg.Sink.Deliver(ctx, recs)
	errs = make([]error, len(recs))
	// An empty result means every record was delivered; any other length
	// mismatch is an error for the records without a result.
	if len(got) == 0 {
		return errs
	}
	for i := range errs {
		if i < len(got) {
			errs[i] = got[i]
		} else {
			errs[i] = fmt.Errorf("sink returned %d results for %d records", len(got), len(recs))
		}
	}
	return errs
}

type outcome struct {
	rec      Record
	err      error
	overload bool // not an attempt: given back
	dead     bool
	delay    time.Duration
	errText  string
}

// record writes the outcomes of one batch in one transaction. Every update
// is conditional on the row still being claimed by us: if our claim lease
// ran out and another drainer re-claimed the row, our late result must not
// overwrite its state.
func (p *pipeDrainer) record(ctx context.Context, recs []Record, errs []error, dur time.Duration) error {
	d := p.d
	var (
		delivered []any
		failed    []outcome
		nDead     int
	)
	minDelay := time.Duration(-1)
	for i, r := range recs {
		if errs[i] == nil {
			delivered = append(delivered, r.ID)
			continue
		}
		o := outcome{rec: r, err: errs[i], overload: sink.IsOverloaded(errs[i])}
		o.dead, o.delay, o.errText = p.verdict(errs[i], r.Attempt)
		if o.dead {
			nDead++
		} else if minDelay < 0 || o.delay < minDelay {
			minDelay = o.delay
		}
		failed = append(failed, o)
	}
	write := func() error {
		tx, err := d.cfg.DB.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if len(delivered) > 0 {
			args := append([]any{}, delivered...)
			args = append(args, d.claimer)
			// next_attempt_at of a done row is when it was done: retention
			// counts from it.
			if _, err := tx.ExecContext(ctx, `UPDATE `+d.outbox+`
SET status = 'delivered', next_attempt_at = NOW(6)
WHERE id IN (`+state.Placeholders(len(delivered))+`) AND status = 'pending' AND claimer = ?`, args...); err != nil {
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
		// The attempt log: one row per attempt, n = the attempt number, for
		// rows that have failed at least once (this attempt, or an earlier
		// one: failedBefore). An attempt of a row that never failed is
		// already told by the outbox row (attempts, status); logging
		// it too cost one more row write per delivery on the hot path. A
		// dead-letter retry restarts n at 1, so existing numbers are
		// overwritten rather than rejected.
		p.mu.Lock()
		logged := make(map[string]bool, len(recs))
		for _, r := range recs {
			logged[r.ID] = p.failedBefore[r.ID] || r.Attempt > 1
		}
		p.mu.Unlock()
		vals := make([]string, 0, len(recs))
		args := make([]any, 0, 4*len(recs))
		errText := make(map[string]any, len(failed))
		for _, o := range failed {
			errText[o.rec.ID] = o.errText
		}
		for _, r := range recs {
			if _, failedNow := errText[r.ID]; !failedNow && !logged[r.ID] {
				continue
			}
			vals = append(vals, "(?, ?, NOW(6), ?, ?)")
			args = append(args, r.ID, r.Attempt, dur.Microseconds(), errText[r.ID])
		}
		if len(vals) > 0 {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+d.attempt+` (outbox_id, n, at, duration_us, error) VALUES `+
				strings.Join(vals, ",")+` ON DUPLICATE KEY UPDATE at = VALUES(at), duration_us = VALUES(duration_us), error = VALUES(error)`, args...); err != nil {
				return fmt.Errorf("log attempts: %w", err)
			}
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

	if err := p.writeOutcome(write); err != nil {
		return fmt.Errorf("record outcome of %d rows of %s (left to their claim lease): %w", len(recs), p.name, err)
	}
	if minDelay >= 0 {
		p.retryDueIn(minDelay)
	}
	commits := make([]time.Time, 0, len(delivered))
	for i, r := range recs {
		if errs[i] == nil {
			commits = append(commits, r.CommitTime)
		}
	}
	d.cfg.Metrics.deliveredAt(p.name, commits)
	if n := len(failed) - nDead; n > 0 {
		d.cfg.Metrics.retried(p.name, n)
		o := failed[0]
		msg := "delivery failed, will retry"
		if o.overload {
			msg = "delivery failed, receiver overloaded; will retry without counting an attempt"
		}
		p.logFailure(msg, n, o.errText, zap.String("id", o.rec.ID), zap.Int("attempt", o.rec.Attempt), zap.Duration("retry_in", o.delay))
	}
	if nDead > 0 {
		d.cfg.Metrics.dead(p.name, nDead)
		for _, o := range failed {
			if o.dead {
				p.log.Error("dead-lettered", zap.String("id", o.rec.ID), zap.Int("attempt", o.rec.Attempt), zap.String("error", o.errText))
			}
		}
	}
	return nil
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

// sqlTime is state.Time: scans DATETIME columns with or without parseTime.
type sqlTime = state.Time
