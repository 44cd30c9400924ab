// Package buildinfo reports cdcout's version and commit.
package buildinfo

import "runtime/debug"

// Set by the linker: -X github.com/cdcout/cdcout/internal/buildinfo.version=…
var (
	version = ""
	commit  = ""
)

// Version is the version the linker was given, else the module version Go
// recorded (go install …@v1.2.3, or a pseudo-version from the checkout's
// VCS stamp), else "dev".
func Version() string {
	if version != "" {
		return version
	}
	bi, _ := debug.ReadBuildInfo()
	v, _ := fromBuildInfo(bi)
	return v
}

// Commit is the VCS revision the linker was given, else the one Go stamped
// (vcs.revision, "-dirty" when vcs.modified), else "unknown".
func Commit() string {
	if commit != "" {
		return commit
	}
	bi, _ := debug.ReadBuildInfo()
	_, c := fromBuildInfo(bi)
	return c
}

// Why says, when neither is known, how to get them; "" otherwise.
func Why() string {
	if Version() != "dev" || Commit() != "unknown" {
		return ""
	}
	return "built without version information (go build -buildvcs=false, or outside a git checkout); make build, or go install github.com/cdcout/cdcout@VERSION, records it"
}

func fromBuildInfo(bi *debug.BuildInfo) (version, commit string) {
	version, commit = "dev", "unknown"
	if bi == nil {
		return version, commit
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		version = v
	}
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified && commit != "unknown" {
		commit += "-dirty"
	}
	return version, commit
}
