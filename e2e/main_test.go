package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// binPath is the cdcout binary built once for the package by TestMain.
// It is built without -race even when the tests run with it: the binary
// is the thing under test, and the race detector's 5-10× slowdown would
// make the crash test's timings meaningless on a 2-core machine.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cdcout-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "cdcout")
	build := exec.Command("go", "build", "-o", binPath, ".")
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	// The race detector flag is inherited through GOFLAGS in some CI
	// setups; the binary must not get it (see binPath).
	build.Env = append(os.Environ(), "GOFLAGS=")
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: go build:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := mysqltest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}
