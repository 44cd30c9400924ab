package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/state"
)

// Drainer defaults. A pipe's are the sink defaults the configuration
// documents (config.DefaultSink…), so a Drainer built without a config
// behaves as a configured sink that sets nothing.
const (
	defaultClaimLease    = 5 * time.Minute
	defaultTimeout       = config.DefaultSinkTimeout
	defaultMaxAttempts   = config.DefaultSinkMaxAttempts
	defaultConcurrency   = config.DefaultSinkConcurrency
	defaultBatchSize     = config.DefaultSinkBatchSize
	defaultBackoffBase   = 200 * time.Millisecond
	defaultBackoffCap    = 5 * time.Minute
	defaultAttemptLogCap = 20

	idleMin = 50 * time.Millisecond
	idleMax = 2 * time.Second
	// outcomeRetryFor bounds how long a delivered batch's outcome write, or
	// the release of a row claim, is retried (database restart) before it
	// is given up: the outcome is then kept and written by the next pass
	// (outcome.go writeKept, segdrain.go takeBack); an unreleased claim is
	// taken back by the next claim pass (release.go).
	outcomeRetryFor = 30 * time.Second
	maxErrorLen     = 4096
	// A write that gives up or settles a claim of ours (an outcome, a
	// release, a hold, a take-back) runs each attempt under a deadline of
	// the claim lease / 60, within [stmtTimeoutMin, stmtTimeoutMax] (5 s
	// for the default 5-minute lease): the state pool has no read timeout,
	// so on a blackholed link a statement would otherwise block until the
	// link heals, and the retry and take-back logic would never run. The
	// driver honours the deadline by closing the connection.
	stmtTimeoutMin = 2 * time.Second
	stmtTimeoutMax = 5 * time.Second
)

// stmtTimeoutFor is the deadline of one claim-settling write for a claim
// lease (see stmtTimeoutMin).
func stmtTimeoutFor(claimLease time.Duration) time.Duration {
	return min(max(claimLease/60, stmtTimeoutMin), stmtTimeoutMax)
}

// PipeConfig is how one pipe is delivered.
type PipeConfig struct {
	Sink Sink
	// Timeout bounds one delivery attempt; the sink's context is cancelled
	// when it passes. Default 10s.
	Timeout time.Duration
	// MaxAttempts: a row whose attempt count reaches it is dead-lettered.
	// Default 25 (config.DefaultSinkMaxAttempts).
	MaxAttempts int
	// Concurrency is how many batches of this pipe are in flight at once.
	// Default 8.
	Concurrency int
	// BatchSize is the most records handed to one Deliver call. Default 100.
	BatchSize int
	// Transactions: the pipe's sink gets transaction records (its
	// transactions: true), so the pipe's segments wait for the sink's
	// older BEGIN records (oldestSegment). Off, they do not read the
	// BEGIN pipe at all; the transaction pipes' records, from before the
	// flag was switched off, still drain (ENDs wait only for older
	// records, BEGINs for nothing).
	Transactions bool
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
	// Wakes, shared by the Drainers of one process, wakes a pipe that
	// waits for another pipe's records when they are acknowledged. Nil:
	// the Drainer's own pipes wake each other only.
	Wakes *Wakes
	// Recent, when it is the Recent of the Store that enqueues (Store.
	// WithRecent), spares reading back the payloads of segments this
	// process wrote. Nil: every payload is read from the database.
	Recent *Recent
}

// Drainer delivers outbox rows to sinks: per pipe, it claims due rows,
// delivers them in batches with bounded concurrency and records each
// outcome. Within a pipe, rows of one key are delivered in commit order and
// a failing row delays only its own key (docs/ARCHITECTURE.md, invariant 5).
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
	// retryFor is outcomeRetryFor and stmtTimeout stmtTimeoutFor(the
	// claim lease); tests of a state-database outage shorten them.
	retryFor    time.Duration
	stmtTimeout time.Duration
	// segmentPoll is how soon a segment loop looks again after it found
	// nothing to do (idleMin) or a segment that had to wait
	// (barrierPoll); tests of the wake-ups (Wakes) lengthen it.
	segmentPoll time.Duration
	// claimedAhead counts segments claimed as read ahead (readAhead).
	claimedAhead atomic.Int64
}

type pipeDrainer struct {
	d    *Drainer
	name string
	cfg  PipeConfig
	// wake has one channel per claimer; a poke wakes them all.
	wake []chan struct{}
	log  *zap.Logger
	// endRecords: the pipe holds its sink's END records. beginPipe, for
	// the END pipe and a data pipe of a sink with transactions
	// (PipeConfig), is the sink's BEGIN pipe, whose older records their
	// segments wait for. waiting: the pipe's oldest segment waits for
	// other pipes' records (oldestSegment, fenceWait), so their
	// acknowledgements wake it (Wakes).
	endRecords bool
	beginPipe  string
	waiting    atomic.Bool

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
	// ahead is the pipe's next segment, read and parsed but not claimed,
	// while the one before it was delivered (segdrain.go, readAhead);
	// touched only by the segment loop.
	ahead *segment
	// unreleased are ids of rows whose claim of ours a failed release
	// left standing: the next claim pass takes them back rather than let
	// their keys wait out the claim lease (release.go). claiming is held
	// shared by each claim from its UPDATE to its read-back and exclusively
	// by the take-back, so a row claimed anew is never released under it.
	unreleased map[string]bool
	claiming   sync.RWMutex
	// kept are outcomes of delivered batches that could not be written
	// past their retries; keptIDs their rows, held in flight (not claimed
	// again by us, not finished) until the next claim pass writes them
	// (outcome.go). writingKept serializes those writes.
	kept        []*keptOutcome
	keptIDs     map[string]bool
	writingKept sync.Mutex
	// failLog rate-limits the "delivery failed" lines: an outage must not
	// flood the log.
	failLogAt  time.Time
	failLogged int // failures left out of the log since failLogAt

	// bg counts the outcome writers of stalled calls a segment did not
	// wait for (finishDetached); the pipe's drain waits for them.
	bg sync.WaitGroup
}

// sinkName is the sink part of the pipe's name.
func (p *pipeDrainer) sinkName() string { return PipeSink(p.name) }

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
		cfg.ClaimLease = defaultClaimLease
	}
	orDefault(&cfg.BackoffBase, defaultBackoffBase)
	orDefault(&cfg.BackoffCap, defaultBackoffCap)
	orDefault(&cfg.AttemptLogCap, defaultAttemptLogCap)
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Wakes == nil {
		cfg.Wakes = NewWakes()
	}
	d := &Drainer{
		cfg:         cfg,
		claimer:     ClaimerID(cfg.ClaimedBy),
		outbox:      state.Table(cfg.Schema, "outbox"),
		segments:    state.Table(cfg.Schema, "segments"),
		attempt:     state.Table(cfg.Schema, "attempts"),
		leases:      state.Table(cfg.Schema, "leases"),
		backoff:     Backoff{Base: cfg.BackoffBase, Cap: cfg.BackoffCap},
		logger:      cfg.Logger.Named("drain"),
		retryFor:    outcomeRetryFor,
		stmtTimeout: stmtTimeoutFor(cfg.ClaimLease),
		segmentPoll: min(idleMin, barrierPoll),
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
		orDefault(&pc.Timeout, defaultTimeout)
		orDefault(&pc.MaxAttempts, defaultMaxAttempts)
		orDefault(&pc.Concurrency, defaultConcurrency)
		orDefault(&pc.BatchSize, defaultBatchSize)
		if cfg.ClaimLease <= pc.Timeout {
			return nil, fmt.Errorf("drainer: claim lease %v must exceed pipe %s's delivery timeout %v, or a slow delivery is handed to a second replica while it is still running", cfg.ClaimLease, name, pc.Timeout)
		}
		instance, _, sink, _ := SplitPipe(name)
		begin, end := txPipeKind(name)
		beginPipe := ""
		if end || pc.Transactions && !begin {
			beginPipe = BeginPipe(instance, sink)
		}
		d.pipes = append(d.pipes, &pipeDrainer{
			d: d, name: name, cfg: pc, endRecords: end, beginPipe: beginPipe,
			// One wake channel per claimer, the last for segments.
			wake:     []chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)},
			log:      d.logger.With(zap.String("pipe", name)),
			inflight: map[string]bool{},

			failedBefore: map[string]bool{},
			unreleased:   map[string]bool{},
			keptIDs:      map[string]bool{},
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

// WakeSegments makes every pipe look for new segments now, and leaves its
// row claimers to their polls: the enqueuer writes records in segments
// (and dead rows, which nothing claims), so a commit gives the row
// claimers nothing to find, and waking them cost two queries per pipe per
// enqueue transaction. Rows come from a segment's leftovers, whose
// drainer wakes its own claimers, and from earlier runs (Wake).
func (d *Drainer) WakeSegments() {
	for _, p := range d.pipes {
		p.pokeSegments()
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

// pokeSegments wakes the pipe's segment loop only.
func (p *pipeDrainer) pokeSegments() {
	select {
	case p.wake[len(claimParts)] <- struct{}{}:
	default:
	}
}

// Run drains every pipe until ctx ends, then stops claiming, lets the
// deliveries in flight finish (each bounded by its timeout), records their
// outcomes and returns nil.
func (d *Drainer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, p := range d.pipes {
		d.cfg.Wakes.add(p)
		defer d.cfg.Wakes.remove(p)
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
		// Kept outcomes get one more try: left unwritten, their rows are
		// released at the stop (Store.ReleaseClaimsOf) and delivered again
		// under the same ids.
		if err := p.writeKept(context.WithoutCancel(ctx)); err != nil {
			p.log.Error("record kept outcomes at stop; their rows are delivered again under the same ids", zap.Error(err))
		}
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

// segmentLoop delivers the pipe's segments one after the other, and waits
// for a wake-up or a poll when there is none.
func (p *pipeDrainer) segmentLoop(ctx context.Context, wake <-chan struct{}) {
	idle := p.d.segmentPoll
	timer := time.NewTimer(idle)
	defer timer.Stop()
	failing := false
	for ctx.Err() == nil {
		n, err := p.drainSegment(ctx)
		switch {
		case err == nil && n > 0:
			idle, failing = p.d.segmentPoll, false
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
			idle = p.d.segmentPoll
		case <-timer.C:
			idle = min(idle*2, idleMax)
		}
	}
}

// sqlTime is state.Time: scans DATETIME columns with or without parseTime.
type sqlTime = state.Time

// orDefault sets *v to def when it is not positive (unset).
func orDefault[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}
