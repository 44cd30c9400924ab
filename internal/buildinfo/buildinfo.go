// Package buildinfo reports cdcout's version and commit.
package buildinfo

import "runtime/debug"

// Set by the linker: -X github.com/cdcout/cdcout/internal/buildinfo.version=…
var (
	version = ""
	commit  = ""
)

// Version is the module version, or "dev" for an untagged build.
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Commit is the VCS revision the binary was built from, or "unknown".
func Commit() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
