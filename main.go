// Command cdcout streams MySQL/MariaDB row changes to webhooks, Kafka, NATS
// and files. See README.md.
package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/cdcout/cdcout/command"
	"github.com/cdcout/cdcout/internal/gctune"
)

func main() {
	gctune.Apply()
	stop := cpuProfile(os.Getenv("CDCOUT_CPUPROFILE"))
	code := command.Main(os.Args, os.Stdin, os.Stdout, os.Stderr)
	stop()
	allocProfile(os.Getenv("CDCOUT_MEMPROFILE"))
	os.Exit(code)
}

// allocProfile writes the allocations of the whole run, sampled, to path
// when it is set (CDCOUT_MEMPROFILE, for `go tool pprof -sample_index
// alloc_space`), at a normal exit as CDCOUT_CPUPROFILE's.
func allocProfile(path string) {
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cdcout: CDCOUT_MEMPROFILE: %v\n", err)
	}
}

// cpuProfile writes a CPU profile of the whole run to path when it is set
// (CDCOUT_CPUPROFILE, for `go tool pprof`); the profile ends at a normal
// exit, so stop cdcout with SIGTERM, not SIGKILL.
func cpuProfile(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cdcout: CDCOUT_CPUPROFILE: %v\n", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
