package gctune

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"
)

func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// Wide lowers GOGC and sets a memory limit sized by the widest event only
// when Apply set GOGC, and narrow restores both.
func TestWide(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "off") // no limit from this machine's cgroup
	was := gcPercent()
	defer debug.SetGCPercent(was)

	Wide(8 << 20)
	if got := gcPercent(); got != was {
		t.Fatalf("Wide before Apply changed GOGC to %d", got)
	}
	Apply()
	if got := gcPercent(); got != Percent {
		t.Fatalf("GOGC after Apply = %d, want %d", got, Percent)
	}
	Wide(8 << 20)
	Wide(4 << 20) // narrower: the limit stays the widest's
	if got, want := gcPercent(), WidePercent; got != want {
		t.Fatalf("GOGC while wide = %d, want %d", got, want)
	}
	if got, want := debug.SetMemoryLimit(-1), wideLimit(wideBase, 8<<20); got != want {
		t.Fatalf("memory limit while wide = %d, want %d", got, want)
	}
	narrow()
	if got := gcPercent(); got != Percent {
		t.Fatalf("GOGC after the wide period = %d, want %d", got, Percent)
	}
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("memory limit after the wide period = %d, want none", got)
	}
	restore.Stop()
}

func TestLiveLimit(t *testing.T) {
	for _, c := range []struct{ live, container, want int64 }{
		{0, 0, liveFloor},
		{20 << 20, 0, liveFloor},          // the usual backlog: GOGC=400's target stays under the floor
		{100 << 20, 0, 300 << 20},         // three times the live heap
		{100 << 20, 200 << 20, 200 << 20}, // never above the container's soft limit
		{10 << 20, 100 << 20, 100 << 20},  // a container below the floor
		{1 << 30, 0, 3 << 30},
	} {
		if got := liveLimit(c.live, c.container); got != c.want {
			t.Errorf("liveLimit(%d, %d) = %d, want %d", c.live, c.container, got, c.want)
		}
	}
}

var held []byte

// The soft limit follows the live heap, at three times it above the
// floor, and is left alone while wide rows pass.
func TestFollowLive(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))

	held = make([]byte, 200<<20)
	for i := range held {
		held[i] = byte(i)
	}
	runtime.GC()
	followOnce()
	got := debug.SetMemoryLimit(-1)
	if got < 3*(200<<20) || got > 3*(240<<20) {
		t.Fatalf("limit with 200 MiB live = %d MiB, want about 600", got>>20)
	}

	held = nil
	runtime.GC()
	mu.Lock()
	wideMax = 1 << 20 // a wide period: its limit stands
	mu.Unlock()
	followOnce()
	if now := debug.SetMemoryLimit(-1); now != got {
		t.Fatalf("limit changed to %d MiB while wide", now>>20)
	}
	mu.Lock()
	wideMax = 0
	mu.Unlock()
	followOnce()
	if now := debug.SetMemoryLimit(-1); now != liveFloor {
		t.Fatalf("limit with little live = %d MiB, want the floor (%d MiB)", now>>20, liveFloor>>20)
	}
}
