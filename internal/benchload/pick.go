package benchload

import (
	"os"
	"slices"
	"strings"
)

// Picked is the workloads of ws that CDCOUT_BENCH_WORKLOADS (a
// comma-separated list of names) picks, in their order; all of them when
// it is unset, so that one slow workload can be run alone.
func Picked(ws ...Workload) []Workload {
	only := os.Getenv("CDCOUT_BENCH_WORKLOADS")
	if only == "" {
		return ws
	}
	names := strings.Split(only, ",")
	var out []Workload
	for _, w := range ws {
		if slices.Contains(names, w.Name) {
			out = append(out, w)
		}
	}
	return out
}
