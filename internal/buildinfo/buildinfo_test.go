package buildinfo

import (
	"runtime/debug"
	"testing"
)

// TestFromBuildInfo: a plain go build in a checkout and go install …@v
// report what Go recorded, not "dev (commit unknown)".
func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name         string
		bi           *debug.BuildInfo
		version, rev string
	}{
		{"none", nil, "dev", "unknown"},
		{"go install @v1.2.3", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "v1.2.3", "unknown"},
		{"go build in a checkout", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201112921-566cbac9b879"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "566cbac9b879"}, {Key: "vcs.modified", Value: "false"}}},
			"v0.0.0-20261201112921-566cbac9b879", "566cbac9b879"},
		{"modified checkout", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}}, "dev", "abc-dirty"},
	} {
		if v, c := fromBuildInfo(tc.bi); v != tc.version || c != tc.rev {
			t.Errorf("%s: %s %s, want %s %s", tc.name, v, c, tc.version, tc.rev)
		}
	}
}
