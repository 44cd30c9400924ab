package engine

import (
	"context"
	"database/sql"
	"errors"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/outbox"
)

// drainLeases spreads the drain leases ("drain/<pipe>") of one instance
// over its live replicas by fair share: each replica holds at most
// ceil(pipes / members) of them, so pipes run on different replicas, a
// joining replica gets its share (the others release their extras) and a
// pipe whose holder died is taken by a replica with room within about a
// TTL.
//
// Membership is a lease too ("member/<holder>/<instance>"), renewed every
// tick: a dead replica drops out of the count when its member lease
// expires on the database clock, exactly when its drain leases do.
type drainLeases struct {
	m        *lease.Manager
	db       *sql.DB
	schema   string
	instance string
	holder   string
	replica  string
	ttl      time.Duration
	log      *zap.Logger
	// acquired is told each pipe whose lease was just taken (to start or
	// wake its drainer).
	acquired func(pipe string)
	// heldMetric, when set, is told when a drain lease is taken or given
	// up (cdcout_lease_held).
	heldMetric func(name string, held bool)
	// reportMember, when set, is told every member lease write's outcome
	// (nil for a success), for readiness.
	reportMember func(error)
	// discover lists pipes with undelivered rows (nil: none).
	discover func(ctx context.Context) ([]string, error)

	mu     sync.Mutex
	held   map[string]lease.Lease
	known  map[string]bool
	member lease.Lease
	ticks  int
	// kick asks for a tick now: a pipe appeared.
	kick chan struct{}
}

func newDrainLeases(m *lease.Manager, db *sql.DB, schema, instance, replica, holder string, ttl time.Duration, log *zap.Logger) *drainLeases {
	return &drainLeases{
		m: m, db: db, schema: schema, instance: instance, replica: replica, holder: holder, ttl: ttl,
		log: log.Named("drainlease"), held: map[string]lease.Lease{}, known: map[string]bool{},
		kick: make(chan struct{}, 1),
	}
}

func drainLeaseName(pipe string) string { return "drain/" + pipe }

func (d *drainLeases) memberName() string { return "member/" + d.holder + "/" + d.instance }

// get is the drainers' Leases hook.
func (d *drainLeases) get(pipe string) (lease.Lease, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.held[pipe]
	return l, ok
}

// count is how many drain leases this replica holds.
func (d *drainLeases) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, l := range d.held {
		if l.Valid(time.Now()) {
			n++
		}
	}
	return n
}

// addPipes makes pipes known (the enqueuer wrote rows for them).
func (d *drainLeases) addPipes(pipes []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	added := false
	for _, p := range pipes {
		if !d.known[p] {
			d.known[p] = true
			added = true
		}
	}
	if added {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
}

// tickEvery is how often leases are renewed and rebalanced: a third of the
// TTL at most, a second at most, with jitter so replicas do not move in step.
func tickEvery(ttl time.Duration) time.Duration {
	base := min(ttl/3, time.Second)
	base = max(base, 50*time.Millisecond)
	return base/2 + rand.N(base/2+1)
}

// run renews and rebalances until ctx ends.
func (d *drainLeases) run(ctx context.Context) {
	for {
		d.tick(ctx)
		t := time.NewTimer(tickEvery(d.ttl))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-d.kick:
			t.Stop()
		}
	}
}

func (d *drainLeases) tick(ctx context.Context) {
	d.ticks++
	// Membership first: our own member lease, then everybody's.
	ml, ok, err := d.m.Acquire(ctx, d.memberName(), d.holder, d.ttl)
	if d.reportMember != nil && ctx.Err() == nil {
		d.reportMember(err)
	}
	if err != nil {
		if ctx.Err() == nil {
			d.log.Debug("renew member lease", zap.Error(err))
		}
		d.renewHeld(ctx)
		return
	}
	if ok {
		d.mu.Lock()
		d.member = ml
		d.mu.Unlock()
	}
	all, err := d.m.List(ctx, "")
	if err != nil {
		d.renewHeld(ctx)
		return
	}
	if d.discover != nil && d.ticks%5 == 1 {
		if ps, err := d.discover(ctx); err == nil {
			d.addPipes(ps)
		}
	}
	members := map[string]bool{d.holder: true}
	liveDrain := map[string]string{} // pipe → holder
	prefix := "drain/" + d.instance + ":"
	var pipes []string
	d.mu.Lock()
	for _, l := range all {
		switch {
		case strings.HasPrefix(l.Name, "member/") && strings.HasSuffix(l.Name, "/"+d.instance):
			if l.Live {
				members[l.Holder] = true
			}
		case strings.HasPrefix(l.Name, prefix):
			p := strings.TrimPrefix(l.Name, "drain/")
			d.known[p] = true
			if l.Live {
				liveDrain[p] = l.Holder
			}
		}
	}
	for p := range d.known {
		pipes = append(pipes, p)
	}
	d.mu.Unlock()
	d.renewHeld(ctx)

	d.mu.Lock()
	heldNow := map[string]bool{}
	for p, l := range d.held {
		if l.Valid(time.Now()) {
			heldNow[p] = true
		}
	}
	d.mu.Unlock()
	free := map[string]bool{}
	for _, p := range pipes {
		if h, ok := liveDrain[p]; !ok || h == d.holder {
			free[p] = true
		}
	}
	release, want := planDrainLeases(pipes, heldNow, free, len(members), d.pref)
	for _, p := range release {
		d.releaseOne(ctx, p, "more than the fair share")
	}
	for _, p := range want {
		l, ok, err := d.m.Acquire(ctx, drainLeaseName(p), d.holder, d.ttl)
		if err != nil || !ok {
			continue
		}
		d.mu.Lock()
		d.held[p] = l
		d.mu.Unlock()
		d.setMetric(p, true)
		d.log.Info("drain lease acquired", zap.String("pipe", p), zap.Uint64("epoch", l.Epoch),
			zap.Int("members", len(members)), zap.Int("pipes", len(pipes)))
		if n, err := d.releaseDeadClaims(ctx, p, members); err != nil {
			d.log.Warn("release claims of replicas that are gone", zap.String("pipe", p), zap.Error(err))
		} else if n > 0 {
			d.log.Info("released rows claimed by replicas that are gone", zap.String("pipe", p), zap.Int64("rows", n))
		}
		if d.acquired != nil {
			d.acquired(p)
		}
	}
}

// releaseDeadClaims returns to pending the pipe's rows and segments
// claimed by processes that are no longer members (their member lease
// expired with their drain lease: killed, or paused past the TTL); see
// outbox.Store.ReleaseClaimsExcept.
func (d *drainLeases) releaseDeadClaims(ctx context.Context, pipe string, members map[string]bool) (int64, error) {
	return outbox.NewStore(d.db, d.schema, d.log).ReleaseClaimsExcept(ctx, pipe, slices.Collect(maps.Keys(members)))
}

// renewHeld renews every held drain lease; one taken over is dropped.
func (d *drainLeases) renewHeld(ctx context.Context) {
	d.mu.Lock()
	held := make(map[string]lease.Lease, len(d.held))
	for p, l := range d.held {
		held[p] = l
	}
	d.mu.Unlock()
	for p, l := range held {
		next, err := d.m.Renew(ctx, l)
		lost := false
		d.mu.Lock()
		switch {
		case err == nil:
			d.held[p] = next
		case errors.Is(err, lease.ErrNotHeld):
			delete(d.held, p)
			lost = true
			d.log.Warn("drain lease lost", zap.String("pipe", p))
		default:
			// Transient: the lease's local deadline decides.
			if !l.Valid(time.Now()) {
				delete(d.held, p)
				lost = true
			}
		}
		d.mu.Unlock()
		if lost {
			d.setMetric(p, false)
		}
	}
}

func (d *drainLeases) releaseOne(ctx context.Context, pipe, why string) {
	d.mu.Lock()
	l, ok := d.held[pipe]
	delete(d.held, pipe)
	d.mu.Unlock()
	if !ok {
		return
	}
	d.setMetric(pipe, false)
	if err := d.m.Release(ctx, l); err != nil && !errors.Is(err, lease.ErrNotHeld) {
		d.log.Warn("release drain lease", zap.String("pipe", pipe), zap.Error(err))
		return
	}
	d.log.Info("drain lease released", zap.String("pipe", pipe), zap.String("why", why))
}

// releaseAll gives every lease up (graceful stop, after the drainers
// returned), the member lease last.
func (d *drainLeases) releaseAll(ctx context.Context) {
	d.mu.Lock()
	var pipes []string
	for p := range d.held {
		pipes = append(pipes, p)
	}
	member := d.member
	d.mu.Unlock()
	for _, p := range pipes {
		d.releaseOne(ctx, p, "stopping")
	}
	if member.Holder != "" {
		if err := d.m.Release(ctx, member); err != nil && !errors.Is(err, lease.ErrNotHeld) {
			d.log.Warn("release member lease", zap.Error(err))
		}
	}
	// Member leases of processes gone for good are the janitor's
	// (outbox.Janitor).
}

func (d *drainLeases) setMetric(pipe string, held bool) {
	if d.heldMetric != nil {
		d.heldMetric(drainLeaseName(pipe), held)
	}
}

// pref orders pipes per replica (rendezvous hashing), so replicas with
// room prefer different free pipes and rarely race for the same one.
func (d *drainLeases) pref(pipe string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(d.replica + "\x00" + pipe))
	return h.Sum64()
}

// fairShare is the most drain leases one of members replicas holds.
func fairShare(pipes, members int) int {
	if pipes <= 0 {
		return 0
	}
	members = max(members, 1)
	return (pipes + members - 1) / members
}

// planDrainLeases decides which held leases to release (above the fair
// share; the least preferred first) and which free pipes to try to acquire
// (up to the share, the most preferred first). free holds pipes nobody
// else holds a live lease on.
func planDrainLeases(pipes []string, held, free map[string]bool, members int, pref func(string) uint64) (release, want []string) {
	share := fairShare(len(pipes), members)
	byPref := func(list []string) {
		slices.SortFunc(list, func(a, b string) int {
			pa, pb := pref(a), pref(b)
			switch {
			case pa < pb:
				return -1
			case pa > pb:
				return 1
			}
			return strings.Compare(a, b)
		})
	}
	var mine, candidates []string
	for _, p := range pipes {
		switch {
		case held[p]:
			mine = append(mine, p)
		case free[p]:
			candidates = append(candidates, p)
		}
	}
	byPref(mine)
	byPref(candidates)
	if len(mine) > share {
		return mine[share:], nil
	}
	n := min(share-len(mine), len(candidates))
	return nil, candidates[:n]
}
