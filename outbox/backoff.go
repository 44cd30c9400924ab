package outbox

import (
	"math/rand/v2"
	"time"
)

// Backoff computes retry delays: base × 2^(attempt-1), capped, with full
// jitter (a uniform delay in [0, that]). Full jitter spreads the retries of
// many rows that failed together (a sink outage) instead of sending them
// back in one synchronized wave when the sink recovers.
type Backoff struct {
	Base time.Duration
	Cap  time.Duration
	// Rand returns a uniform value in [0, n); nil means math/rand/v2.
	Rand func(n int64) int64
}

// Ceiling is the un-jittered delay for the given attempt (counting from 1).
func (b Backoff) Ceiling(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := b.Base
	for i := 1; i < attempt; i++ {
		if d >= b.Cap/2 {
			return b.Cap
		}
		d *= 2
	}
	if d > b.Cap {
		return b.Cap
	}
	return d
}

// Delay is the jittered delay before retrying after the given attempt.
func (b Backoff) Delay(attempt int) time.Duration {
	c := b.Ceiling(attempt)
	if c <= 0 {
		return 0
	}
	rnd := b.Rand
	if rnd == nil {
		rnd = rand.Int64N
	}
	return time.Duration(rnd(int64(c) + 1))
}
