package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Keeper renews one held lease at a third of its TTL until its context ends
// or the lease is lost. Lost is closed once the lease can no longer be acted
// on: a renewal found it taken (ErrNotHeld), or renewals kept failing until
// the local deadline passed.
type Keeper struct {
	m      *Manager
	logger *zap.Logger
	// OnRenew, when set before Run, is told every renewal's outcome (nil
	// for a success), so readiness can report a lease that cannot be
	// written.
	OnRenew func(error)

	mu   sync.Mutex
	l    Lease
	err  error
	lost chan struct{}
	once sync.Once
}

// NewKeeper returns a Keeper for l, which must have come from Acquire.
func (m *Manager) NewKeeper(l Lease, logger *zap.Logger) *Keeper {
	if logger == nil {
		logger = zap.NewNop()
	}
	return &Keeper{m: m, l: l, logger: logger.Named("lease").With(zap.String("lease", l.Name)), lost: make(chan struct{})}
}

// Lease returns the lease as of the latest renewal. Check Valid(time.Now())
// before every leadership action.
func (k *Keeper) Lease() Lease {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.l
}

// Lost is closed when the lease is lost; Err then says why.
func (k *Keeper) Lost() <-chan struct{} { return k.lost }

// Err is the reason the lease was lost, nil while it is held.
func (k *Keeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

func (k *Keeper) lose(err error) {
	k.once.Do(func() {
		k.mu.Lock()
		k.err = err
		k.mu.Unlock()
		close(k.lost)
	})
}

// Run renews until ctx ends (returning ctx.Err(), the lease still held; the
// caller decides whether to Release it) or the lease is lost (returning
// ErrNotHeld).
func (k *Keeper) Run(ctx context.Context) error {
	l := k.Lease()
	interval := l.TTL / 3
	if interval <= 0 {
		interval = time.Second
	}
	retry := interval / 4
	if retry < 50*time.Millisecond {
		retry = 50 * time.Millisecond
	}
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		cur := k.Lease()
		if !cur.Valid(time.Now()) {
			k.logger.Warn("lease lost: local deadline passed without a successful renewal")
			k.lose(ErrNotHeld)
			return ErrNotHeld
		}
		// A renewal must not outlive the local deadline: a reply that arrives
		// after it could not be trusted anyway.
		rctx, cancel := context.WithDeadline(ctx, cur.LocalDeadline)
		next, err := k.m.Renew(rctx, cur)
		cancel()
		if k.OnRenew != nil && ctx.Err() == nil {
			k.OnRenew(err)
		}
		switch {
		case err == nil:
			k.mu.Lock()
			k.l = next
			k.mu.Unlock()
			t.Reset(interval)
		case errors.Is(err, ErrNotHeld):
			k.logger.Warn("lease lost: taken over or expired", zap.Uint64("epoch", cur.Epoch))
			k.lose(ErrNotHeld)
			return ErrNotHeld
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			k.logger.Warn("renew lease", zap.Error(err))
			t.Reset(retry)
		}
	}
}
