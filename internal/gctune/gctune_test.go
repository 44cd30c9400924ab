package gctune

import (
	"math"
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
