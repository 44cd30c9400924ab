package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestProfilesAtExit: CDCOUT_CPUPROFILE and CDCOUT_MEMPROFILE (README,
// operations) each leave a profile that go tool pprof reads, of the kind
// it says, when cdcout exits normally.
func TestProfilesAtExit(t *testing.T) {
	dir := t.TempDir()
	cpu, mem := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "mem.pprof")
	cmd := exec.Command(binPath, "version")
	cmd.Env = append(os.Environ(), "CDCOUT_CPUPROFILE="+cpu, "CDCOUT_MEMPROFILE="+mem)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cdcout version: %v\n%s", err, out)
	}
	for path, want := range map[string]string{cpu: "Type: cpu", mem: "Type: alloc_space"} {
		args := []string{"tool", "pprof", "-top"}
		if path == mem {
			args = append(args, "-sample_index=alloc_space")
		}
		out, err := exec.Command("go", append(args, path)...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("go tool pprof %s: %v, want %q in:\n%s", filepath.Base(path), err, want, out)
		}
	}
}
