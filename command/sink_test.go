package command

import (
	"strings"
	"testing"
)

// TestSinkPauseResume: the commands pause and resume a known sink,
// status shows it, and an unknown sink is refused with the known ones.
func TestSinkPauseResume(t *testing.T) {
	dsn, schema := statusFixture(t)
	args := func(verb, sink string) []string {
		return []string{"sink", verb, "--dsn", dsn, "--state-db", schema, "--instance", "shop", sink}
	}
	for _, step := range []struct {
		verb, sink string
		code       int
		out        string // stdout, or stderr when code is not 0
		status     string // in cdcout status afterwards
	}{
		{"pause", "hook", ExitOK, "sink hook of instance shop paused: no replica delivers it until cdcout sink resume hook", "shop:app.orders:hook (paused)"},
		{"pause", "hook", ExitOK, "sink hook of instance shop was already paused", "shop:app.orders:hook (paused)"},
		{"pause", "hooks", ExitConfig, `instance shop has no sink "hooks" (known sinks: hook)`, "shop:app.orders:hook (paused)"},
		{"resume", "hook", ExitOK, "sink hook of instance shop resumed", "shop:app.orders:hook  "},
	} {
		code, out, errOut := runCmd(t, args(step.verb, step.sink)...)
		if code != ExitOK {
			out = errOut
		}
		if code != step.code || !strings.Contains(out, step.out) {
			t.Fatalf("sink %s %s: exit %d, %q; want exit %d with %q", step.verb, step.sink, code, out, step.code, step.out)
		}
		code, out, errOut = runCmd(t, "status", "--dsn", dsn, "--state-db", schema, "--instance", "shop")
		if code != ExitOK || !strings.Contains(out, step.status) {
			t.Fatalf("status after sink %s %s: exit %d, %s%s; want %q", step.verb, step.sink, code, out, errOut, step.status)
		}
	}
	if code, _, errOut := runCmd(t, "sink", "pause", "--dsn", dsn, "--state-db", schema); code != ExitConfig || !strings.Contains(errOut, "cdcout sink pause NAME") {
		t.Errorf("pause without a name: exit %d, %s", code, errOut)
	}
}

// TestSinkReplay: the command checks the sink and the range, records a
// replay that status then shows, and refuses a second one while it runs.
func TestSinkReplay(t *testing.T) {
	dsn, schema := statusFixture(t)
	args := func(rest ...string) []string {
		return append([]string{"sink", "replay", "--dsn", dsn, "--state-db", schema, "--instance", "shop"}, rest...)
	}
	for _, step := range []struct {
		args []string
		code int
		out  string // stdout, or stderr when code is not 0
	}{
		{args("--from", "0-1-1", "hooks"), ExitConfig, `instance shop has no sink "hooks"`},
		{args("--from", "last tuesday", "hook"), ExitConfig, `--from: "last tuesday" is not a GTID`},
		{args("--from", "2100-01-01T00:00:00Z", "hook"), ExitOK, "replay 1 of sink hook of instance shop from 2100-01-01T00:00:00Z asked for"},
		{args("--from", "2100-01-01T00:00:00Z", "hook"), ExitConfig, "the sink has a replay running (replay 1)"},
	} {
		code, out, errOut := runCmd(t, step.args...)
		if code != ExitOK {
			out = errOut
		}
		if code != step.code || !strings.Contains(out, step.out) {
			t.Fatalf("%v: exit %d, %q; want exit %d with %q", step.args, code, out, step.code, step.out)
		}
	}
	code, out, errOut := runCmd(t, "status", "--dsn", dsn, "--state-db", schema, "--instance", "shop")
	if code != ExitOK || !strings.Contains(out, "REPLAYS") || !strings.Contains(out, "from 2100-01-01T00:00:00Z  running") {
		t.Fatalf("status: exit %d, %s%s", code, out, errOut)
	}
}
