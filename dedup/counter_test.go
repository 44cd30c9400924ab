package dedup

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestOccurrenceCounterCounts(t *testing.T) {
	c := NewOccurrenceCounter(time.Minute, 100)
	steps := []struct {
		digest string
		at     time.Duration
		want   int
	}{
		{"a", 0, 0},
		{"a", time.Second, 1},
		{"b", 2 * time.Second, 0},
		{"a", 3 * time.Second, 2},
		// 61 s after a's last sighting: forgotten, starts again.
		{"a", 64 * time.Second, 0},
		// b was last seen 62 s earlier and pruned by the previous Next.
		{"b", 64 * time.Second, 0},
		{"b", 65 * time.Second, 1},
	}
	for i, s := range steps {
		if got := c.Next(s.digest, t0.Add(s.at)); got != s.want {
			t.Fatalf("step %d: Next(%q, +%v) = %d, want %d", i, s.digest, s.at, got, s.want)
		}
	}
	if got, want := c.Len(), 2; got != want {
		t.Fatalf("Len = %d, want %d", got, want)
	}
	c.Prune(t0.Add(66*time.Second + time.Minute))
	if got, want := c.Len(), 0; got != want {
		t.Fatalf("Len after prune = %d, want %d", got, want)
	}
}

// A digest seen exactly one window ago is still inside it.
func TestOccurrenceCounterWindowEdge(t *testing.T) {
	c := NewOccurrenceCounter(time.Minute, 10)
	c.Next("a", t0)
	if got := c.Next("a", t0.Add(time.Minute)); got != 1 {
		t.Fatalf("at exactly the window: %d, want 1", got)
	}
}

func TestOccurrenceCounterSizeBound(t *testing.T) {
	c := NewOccurrenceCounter(time.Hour, 3)
	for i := 0; i < 10; i++ {
		c.Next(fmt.Sprint("d", i), t0)
		if c.Len() > 3 {
			t.Fatalf("Len = %d after %d digests, ceiling 3", c.Len(), i+1)
		}
	}
	// d7 d8 d9 remain; touching d7 makes d8 the least recently seen.
	if got := c.Next("d7", t0); got != 1 {
		t.Fatalf("d7 = %d, want 1", got)
	}
	c.Next("new", t0)
	if got := c.Next("d8", t0); got != 0 {
		t.Fatalf("d8 should have been evicted first, got occurrence %d", got)
	}
	if got := c.Next("d7", t0); got != 2 {
		t.Fatalf("d7 = %d, want 2 (kept as recently seen)", got)
	}
}

// Two replicas fed the same event sequence agree even if one of them also
// prunes at other moments (with event times, as required).
func TestOccurrenceCounterReplicasAgree(t *testing.T) {
	a := NewOccurrenceCounter(10*time.Second, 50)
	b := NewOccurrenceCounter(10*time.Second, 50)
	for i := 0; i < 2000; i++ {
		d := fmt.Sprint(i % 37 * (i % 3))
		at := t0.Add(time.Duration(i) * 97 * time.Millisecond)
		if i%11 == 0 {
			b.Prune(at)
		}
		if x, y := a.Next(d, at), b.Next(d, at); x != y {
			t.Fatalf("event %d: replicas disagree: %d vs %d", i, x, y)
		}
	}
}

func TestOccurrenceCounterSeed(t *testing.T) {
	c := NewOccurrenceCounter(time.Minute, 100)
	c.SeedFromChangeKeys([]string{
		DigestKey("a", 0), DigestKey("a", 2), DigestKey("a", 1),
		DigestKey("b", 0),
		GTIDKey("0-1-5", 0), // other kinds are ignored
		BackfillKey("x", "y"),
		"garbage",
	}, t0)
	if got, want := c.Len(), 2; got != want {
		t.Fatalf("Len = %d, want %d", got, want)
	}
	if got := c.Next("a", t0.Add(time.Second)); got != 3 {
		t.Fatalf("a after seed = %d, want 3", got)
	}
	if got := c.Next("b", t0.Add(time.Second)); got != 1 {
		t.Fatalf("b after seed = %d, want 1", got)
	}
	if got := c.Next("c", t0.Add(time.Second)); got != 0 {
		t.Fatalf("c after seed = %d, want 0", got)
	}
	// Seeded entries age out like any other.
	c.SeedFromChangeKeys([]string{DigestKey("z", 4)}, t0)
	if got := c.Next("z", t0.Add(2*time.Minute)); got != 0 {
		t.Fatalf("z after its window = %d, want 0", got)
	}
}

func BenchmarkOccurrenceCounterNext(b *testing.B) {
	c := NewOccurrenceCounter(time.Minute, 100_000)
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("%064x", i*7919)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Next(keys[i%len(keys)], t0.Add(time.Duration(i)*time.Microsecond))
	}
}
