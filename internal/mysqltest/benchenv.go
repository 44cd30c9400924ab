package mysqltest

import (
	"os"
	"strconv"
)

// BenchEnv is the positive whole number the environment variable name
// holds (CDCOUT_BENCH_ROWS and the like: how large a benchmark's load is),
// else def: an unset, malformed or non-positive value keeps the default
// rather than making a benchmark of nothing.
func BenchEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
