// Package gctune sets the garbage collector the way the cdcout binary runs
// it.
package gctune

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Percent is cdcout's GOGC when the environment sets none. Every change
// allocates about 2 KB (row maps, values, the change itself) and every
// webhook request several more (request, headers, response) that are
// garbage microseconds later, against a live heap of a few tens of MB, so
// at Go's default of 100 the collector runs very often. Measured on this
// project's 2-core box: the stream alone (BenchmarkStreamVsRaw, CPU per
// row) 3.66 µs at GOGC=100, 3.15 µs at 200, 3.05 µs at 400; end to end
// with one webhook POST per record (BenchmarkEndToEndBinary, 300k
// changes) cdcout spent 54–59 µs per change at 200 and 49–53 µs at 400
// (17.8k–19.4k against 19.7k–21.0k changes/s); one 1,000,000-row
// transaction peaked at 90–115 MB RSS at 200, 120 MB at 300 and 135 MB at
// 400. 400 takes the CPU for memory that stays well inside the 200 MB the
// project allows a huge transaction; set GOGC (or GOMEMLIMIT) to trade
// the other way.
const Percent = 400

// While wide rows pass (Wide), the collector runs at WidePercent and under
// a soft memory limit of what the runtime held when the wide period began
// (its baseline) + wideFactor × the widest rows event seen, and never
// below wideFloor. At Percent the heap may grow to five times what was live at the
// last collection, and the spans a multi-MiB value leaves free are kept
// (a larger value cannot reuse them) until the background scavenger
// returns them, slowly: one 16 MiB BLOB update was measured at 440 MB
// peak RSS, 284–399 MB at GOGC=100 alone. The limit makes the collector
// and the scavenger keep up. Wide rows are rare, so the CPU this costs is
// too; the limit is soft (the collector caps its own CPU share), and an
// explicit GOMEMLIMIT lower than it wins.
const (
	WidePercent = 100
	wideFloor   = 8 << 20
	wideFactor  = 3
)

// wideFor is how long after the last wide row the collector returns to
// Percent and no limit: long enough for the row's delivery.
const wideFor = 30 * time.Second

var (
	mu        sync.Mutex
	applied   bool  // Apply set Percent, so Wide may change it
	wideMax   int   // widest event of the current wide period, 0 outside one
	wideBase  int64 // runtime memory when the wide period began
	prevLimit int64
	restore   *time.Timer

	// container is the cgroup's memory limit Apply found, containerSoft
	// the soft limit it set from it; 0 when it set none.
	container, containerSoft int64
)

// Container returns the memory limit of the process's cgroup and the soft
// memory limit Apply set from it, both 0 when it set none (no limit, or
// GOMEMLIMIT set).
func Container() (limit, soft int64) {
	mu.Lock()
	defer mu.Unlock()
	return container, containerSoft
}

// Apply sets Percent unless GOGC is set in the environment, which wins,
// and, unless GOMEMLIMIT is set, a soft memory limit of ContainerShare of
// the memory limit of the cgroup the process runs in, if it has one.
func Apply() {
	if os.Getenv("GOMEMLIMIT") == "" {
		if self, err := os.ReadFile("/proc/self/cgroup"); err == nil {
			if l := cgroupMemoryLimit("/sys/fs/cgroup", self); l > 0 {
				soft := int64(float64(l) * ContainerShare)
				debug.SetMemoryLimit(soft)
				mu.Lock()
				container, containerSoft = l, soft
				mu.Unlock()
			}
		}
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(Percent)
		mu.Lock()
		applied = true
		mu.Unlock()
		if os.Getenv("GOMEMLIMIT") == "" {
			go followLive()
		}
	}
}

// At Percent the heap may grow to five times what the last collection
// found live, and a collection that runs while much is live for a moment
// (batches in flight, kept segments, a burst of rows) sets that target
// for the whole cycle: a 200,000-change realistic backlog peaked at
// 264–300 MB RSS in 8 of 28 runs where the others stayed at 152–231 MB
// (live heap 13–23 MB, heap at a collection 70–115 MB). So, unless GOGC
// or GOMEMLIMIT is set, a soft memory limit follows the live heap: three
// times it (GOGC=200's target), never below liveFloor, which the usual
// targets stay under, so it costs nothing while little is live, and never
// above the container's soft limit. It is read every liveEvery; while
// wide rows pass their own limit stands.
const (
	liveFloor  = 160 << 20
	liveFactor = 3
	liveEvery  = 250 * time.Millisecond
)

// liveLimit is the soft memory limit for a live heap of live bytes under
// a container's soft limit (0: none).
func liveLimit(live, container int64) int64 {
	l := max(liveFloor, liveFactor*live)
	if container > 0 {
		l = min(l, container)
	}
	return l
}

func followLive() {
	for range time.Tick(liveEvery) {
		followOnce()
	}
}

// followOnce sets the soft memory limit for the live heap now, outside a
// wide period.
func followOnce() {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	live := int64(s[0].Value.Uint64())
	mu.Lock()
	defer mu.Unlock()
	if l := liveLimit(live, containerSoft); wideMax == 0 && l != debug.SetMemoryLimit(-1) {
		debug.SetMemoryLimit(l)
	}
}

// Wide says that a rows event of n bytes (a wide row) is passing: see
// WidePercent. It lasts until wideFor after the last call. It does
// nothing unless Apply set Percent (an explicit GOGC wins, and tests and
// libraries that never call Apply are left alone).
func Wide(n int) {
	mu.Lock()
	defer mu.Unlock()
	if !applied || n <= wideMax {
		if restore != nil && wideMax > 0 {
			restore.Reset(wideFor)
		}
		return
	}
	if wideMax == 0 {
		debug.SetGCPercent(WidePercent)
		prevLimit = debug.SetMemoryLimit(-1)
		wideBase = runtimeMemory()
	}
	wideMax = n
	debug.SetMemoryLimit(min(prevLimit, wideLimit(wideBase, n)))
	if restore == nil {
		restore = time.AfterFunc(wideFor, narrow)
		return
	}
	restore.Reset(wideFor)
}

func narrow() {
	mu.Lock()
	defer mu.Unlock()
	if wideMax > 0 {
		wideMax = 0
		debug.SetGCPercent(Percent)
		debug.SetMemoryLimit(prevLimit)
	}
}

// wideLimit is the soft memory limit while rows events of up to n bytes
// pass, base being what the runtime held before the first.
func wideLimit(base int64, n int) int64 {
	return max(wideFloor, base+int64(wideFactor*n))
}

// runtimeMemory is what the memory limit counts: the memory the Go runtime
// has mapped, less what it has returned to the operating system.
func runtimeMemory() int64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64()) - int64(s[1].Value.Uint64())
}
