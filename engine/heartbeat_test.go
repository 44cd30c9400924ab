package engine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/config"
)

// TestHeartbeats: a sink with heartbeat 1s gets "hb" records carrying
// the position read while its table is quiet, none while changes keep
// coming faster than that, and heartbeats again after, at or past the
// last change's position; a sink without the option gets none.
func TestHeartbeats(t *testing.T) {
	dir := t.TempDir()
	hbFile, plainFile := filepath.Join(dir, "hb.jsonl"), filepath.Join(dir, "plain.jsonl")
	s := newSource(t, "hbeat", "id INT PRIMARY KEY", func(cfg *config.Config) {
		cfg.Sinks = []config.Sink{
			// native: the stored envelopes, whose op tells heartbeats
			// from changes (debezium's heartbeats have none).
			{Name: "hb", URL: "file://" + hbFile, Heartbeat: time.Second, Format: "native"},
			{Name: "plain", URL: "file://" + plainFile},
		}
	})
	runEngine(t, s.cfg, zaptest.NewLogger(t))

	type line struct {
		Op     string `json:"op"`
		Source struct {
			DB      string `json:"db"`
			File    string `json:"file"`
			Pos     uint32 `json:"pos"`
			GTIDSet string `json:"gtid_set"`
			TsMs    int64  `json:"ts_ms"`
		} `json:"source"`
		TsMs int64 `json:"ts_ms"`
	}
	read := func() []line {
		b, _ := os.ReadFile(hbFile)
		var out []line
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var v line
			if l != "" && json.Unmarshal([]byte(l), &v) == nil {
				out = append(out, v)
			}
		}
		return out
	}
	count := func(ls []line, op string) (n int) {
		for _, l := range ls {
			if l.Op == op {
				n++
			}
		}
		return n
	}
	waitFor(t, "two heartbeats of the quiet sink", 15*time.Second, func() bool { return count(read(), "hb") >= 2 })
	first := read()
	for i, l := range first {
		// Started from a GTID set, the stream knows its file only from the
		// first transaction on.
		if l.Op != "hb" || l.Source.DB != "__cdcout" || l.Source.GTIDSet == "" {
			t.Fatalf("line %d = %+v, want a heartbeat with a position", i, l)
		}
		if i > 0 && l.TsMs-first[i-1].TsMs < 950 {
			t.Fatalf("heartbeats %d ms apart, want about 1000", l.TsMs-first[i-1].TsMs)
		}
	}

	// Changes every 50 ms for 2 s: no heartbeat in between (a second
	// without an enqueue would take a stall of the whole machine).
	const n = 40
	for i := range n {
		s.srv.Exec(t, "INSERT INTO `"+s.src+"`.t VALUES ("+strconv.Itoa(i)+")")
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(t, "the changes and two heartbeats after them", 15*time.Second, func() bool {
		ls := read()
		last := -1
		for i, l := range ls {
			if l.Op == "c" {
				last = i
			}
		}
		return count(ls, "c") == n && last >= 0 && count(ls[last:], "hb") >= 2
	})
	ls := read()
	firstC, lastC := -1, -1
	for i, l := range ls {
		if l.Op == "c" {
			if firstC < 0 {
				firstC = i
			}
			lastC = i
		}
	}
	if hb := count(ls[firstC:lastC+1], "hb"); hb != 0 {
		t.Errorf("%d heartbeats among changes arriving every 50 ms, want none", hb)
	}
	after, change := ls[lastC+1], ls[lastC]
	if after.Op != "hb" || after.Source.File < change.Source.File ||
		(after.Source.File == change.Source.File && after.Source.Pos < change.Source.Pos) {
		t.Errorf("heartbeat after the last change at %s:%d = %+v, want at or past it", change.Source.File, change.Source.Pos, after)
	}
	if after.Source.TsMs < change.Source.TsMs {
		t.Errorf("heartbeat's source ts_ms %d is before the last change's %d", after.Source.TsMs, change.Source.TsMs)
	}
	if b, _ := os.ReadFile(plainFile); strings.Contains(string(b), `"db":"__cdcout"`) {
		t.Errorf("the sink without heartbeat: got heartbeats")
	}
}
