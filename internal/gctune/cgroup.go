package gctune

import (
	"bufio"
	"bytes"
	"os"
	"path"
	"strconv"
	"strings"
)

// ContainerShare is the share of its container's memory limit that cdcout
// takes as its soft memory limit (runtime/debug.SetMemoryLimit) when
// GOMEMLIMIT is not set. At GOGC=Percent the heap may grow to five times
// what was live at the last collection: a 200,000-change backlog on
// realistic rows peaked at 160–340 MB of RSS from run to run, whatever the
// container allowed. Under a soft limit the collector runs sooner as the
// heap nears it instead of the kernel killing the process; the rest of the
// limit is left for what the runtime does not count (stacks of cgo calls,
// the binary's own pages).
const ContainerShare = 0.9

// noLimit: cgroup v1 reports an unlimited group as the largest
// page-aligned int64 (9223372036854771712); anything this large is no
// limit.
const noLimit = 1 << 60

// cgroupMemoryLimit returns the memory limit, in bytes, of the cgroup this
// process runs in: the lowest limit of its group and the groups above it,
// cgroup v2's memory.max or v1's memory.limit_in_bytes, or 0 when none is
// set or none can be read. root is where the cgroup file systems are
// mounted (/sys/fs/cgroup); self is /proc/self/cgroup.
//
// In a container with its own cgroup namespace the path in self is "/",
// the container's group; without one, the container sees its group at
// the mount's root while self names its path on the host, which does not
// exist inside: walking up from that path reaches the root and finds the
// container's limit there.
func cgroupMemoryLimit(root string, self []byte) int64 {
	var best int64
	for _, h := range memoryHierarchies(root, self) {
		for g := h.group; ; g = path.Dir(g) {
			if l := readLimit(path.Join(h.dir, g, h.file)); l > 0 && (best == 0 || l < best) {
				best = l
			}
			if g == "/" {
				break
			}
		}
	}
	return best
}

// memoryHierarchy is a cgroup hierarchy that limits memory, as
// /proc/self/cgroup names it: where it is mounted, the process's group in
// it, and the name of a group's limit file.
type memoryHierarchy struct {
	dir, group, file string
}

// memoryHierarchies lists the hierarchies of self (/proc/self/cgroup) that
// limit memory, mounted under root: cgroup v2's unified one and v1's
// memory controller.
func memoryHierarchies(root string, self []byte) []memoryHierarchy {
	var hs []memoryHierarchy
	sc := bufio.NewScanner(bytes.NewReader(self))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		id, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		controllers, group, ok := strings.Cut(rest, ":")
		if !ok || !strings.HasPrefix(group, "/") {
			continue
		}
		switch {
		case id == "0" && controllers == "":
			hs = append(hs, memoryHierarchy{root, path.Clean(group), "memory.max"}) // v2, the unified hierarchy
		case hasController(controllers, "memory"):
			hs = append(hs, memoryHierarchy{path.Join(root, "memory"), path.Clean(group), "memory.limit_in_bytes"}) // v1
		}
	}
	return hs
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// readLimit reads one limit file: a number of bytes, or "max" (v2) or a
// number of noLimit or more (v1) for none, which is 0, as is a file that
// cannot be read.
func readLimit(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 || n >= noLimit {
		return 0
	}
	return n
}
