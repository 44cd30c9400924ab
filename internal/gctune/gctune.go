// Package gctune sets the garbage collector the way the cdcout binary runs
// it.
package gctune

import (
	"os"
	"runtime/debug"
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

// Apply sets Percent unless GOGC is set in the environment, which wins.
func Apply() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(Percent)
	}
}
