package gctune

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
)

// The cgroup layouts a process finds itself in: cgroup v2 in a container
// with its own namespace, nested groups, cgroup v1 seen from inside a
// container without one (the host's path does not exist there), a hybrid
// host, and files that say there is no limit.
func TestCgroupMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string // under the cgroup root
		self  string
		want  int64
	}{
		{"v2 namespace", map[string]string{"memory.max": "536870912\n"}, "0::/\n", 512 << 20},
		{"v2 unlimited", map[string]string{"memory.max": "max\n"}, "0::/\n", 0},
		{"v2 lowest of the ancestors", map[string]string{
			"memory.max": "max\n", "a/memory.max": "1073741824\n", "a/b/memory.max": "max\n",
		}, "0::/a/b\n", 1 << 30},
		{"v2 own lower than its parent's", map[string]string{
			"a/memory.max": "1073741824\n", "a/b/memory.max": "268435456\n",
		}, "0::/a/b\n", 256 << 20},
		{"v1 without a namespace", map[string]string{"memory/memory.limit_in_bytes": "314572800\n"},
			"12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n", 300 << 20},
		{"v1 unlimited", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, "4:memory:/\n", 0},
		{"v1 among other controllers", map[string]string{"memory/x/memory.limit_in_bytes": "104857600\n"},
			"5:cpu,memory:/x\n", 100 << 20},
		{"hybrid", map[string]string{"memory/memory.limit_in_bytes": "209715200\n", "cgroup.procs": ""},
			"4:memory:/\n0::/\n", 200 << 20},
		{"no memory controller", map[string]string{"cpu/memory.limit_in_bytes": "104857600\n"}, "3:cpu:/\n", 0},
		{"garbage", map[string]string{"memory.max": "lots\n"}, "0::/\nnot a line\n4:memory\n", 0},
		{"nothing readable", nil, "0::/\n4:memory:/\n", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for name, body := range c.files {
				f := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if got := cgroupMemoryLimit(root, []byte(c.self)); got != c.want {
				t.Fatalf("limit = %d, want %d", got, c.want)
			}
		})
	}
}

// The helper process of TestApplyInContainer: it prints what Apply set.
func TestApplyHelper(t *testing.T) {
	if os.Getenv("CDCOUT_GCTUNE_HELPER") != "1" {
		return // run only as TestApplyInContainer's child
	}
	Apply()
	limit, soft := Container()
	fmt.Printf("limit=%d soft=%d runtime=%d\n", limit, soft, debug.SetMemoryLimit(-1))
}

// In a real memory cgroup of 300 MiB (cgroup v1 here; v2 where its memory
// controller can be given to a new group), Apply sets 90 % of it as the
// runtime's soft limit, and GOMEMLIMIT, when set, wins.
func TestApplyInContainer(t *testing.T) {
	group, procs := newMemoryGroup(t, 300<<20)
	run := func(env ...string) string {
		t.Helper()
		// The shell joins the group before it becomes the test binary, so
		// Apply runs inside it from its first instruction.
		cmd := exec.Command("sh", "-c", `echo $$ > "$1" && exec "$2" -test.run '^TestApplyHelper$'`,
			"sh", procs, os.Args[0])
		cmd.Env = append(os.Environ(), append([]string{"CDCOUT_GCTUNE_HELPER=1", "GOGC=", "GOMEMLIMIT="}, env...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helper in %s: %v\n%s", group, err, out)
		}
		return string(out)
	}
	soft := int64(float64(300<<20) * ContainerShare)
	if out, want := run(), fmt.Sprintf("limit=%d soft=%d runtime=%d\n", 300<<20, soft, soft); !strings.HasPrefix(out, want) {
		t.Fatalf("in the group the helper printed %q, want %q first", out, want)
	}
	if out, want := run("GOMEMLIMIT=1GiB"), fmt.Sprintf("limit=0 soft=0 runtime=%d\n", 1<<30); !strings.HasPrefix(out, want) {
		t.Fatalf("with GOMEMLIMIT set the helper printed %q, want %q first", out, want)
	}
}

// newMemoryGroup makes a memory cgroup below this process's own with the
// given limit, removed at the end of the test, and returns it and its
// cgroup.procs file. It skips the test where this machine does not let a
// process make one (not root, or cgroups mounted read-only).
func newMemoryGroup(t *testing.T, limit int64) (dir, procs string) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skipf("no /proc/self/cgroup: %v", err)
	}
	name := fmt.Sprintf("cdcout-gctune-%d", os.Getpid())
	for _, h := range memoryHierarchies("/sys/fs/cgroup", self) {
		base := filepath.Join(h.dir, h.group)
		if h.file == "memory.max" {
			if b, err := os.ReadFile(filepath.Join(base, "cgroup.subtree_control")); err != nil || !strings.Contains(string(b), "memory") {
				continue // v2 without the memory controller for new groups here
			}
		}
		dir = filepath.Join(base, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			continue
		}
		t.Cleanup(func() { os.Remove(dir) })
		if err := os.WriteFile(filepath.Join(dir, h.file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
			t.Fatalf("set the limit of %s: %v", dir, err)
		}
		return dir, filepath.Join(dir, "cgroup.procs")
	}
	t.Skip("this machine does not let the test make a memory cgroup (not root, or no writable memory controller)")
	return "", ""
}
