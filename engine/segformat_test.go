package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/state"
)

func TestFleetSegmentFormat(t *testing.T) {
	row := func(id string, payload any) fleet.Row {
		b, _ := json.Marshal(payload)
		return fleet.Row{ReplicaID: id, Version: "v-" + id, Payload: b}
	}
	reads := inspect.EngineInfo{Instance: "i", ReadsSegmentFormat: 2}
	old := inspect.EngineInfo{Instance: "i"}
	members := func(ids ...string) []fleet.Member {
		var out []fleet.Member
		for _, id := range ids {
			out = append(out, fleet.Member{ID: id})
		}
		return out
	}
	cases := []struct {
		name    string
		rows    []fleet.Row
		members []fleet.Member
		want    int
		why     string
	}{
		{"alone", nil, nil, 2, "every replica"},
		{"every member reads it", []fleet.Row{row("a", reads), row("b", reads)}, members("a", "b"), 2, "every replica"},
		{"an older release", []fleet.Row{row("a", reads), row("b", old)}, members("a", "b"), 1, "replica b (release v-b) does not read segment format 2"},
		{"a lease holder without a row", []fleet.Row{row("a", reads)}, members("a", "c"), 1, "replica c holds a lease but has written no fleet row"},
		{"an unreadable row", []fleet.Row{{ReplicaID: "d", Version: "v-d", Payload: json.RawMessage(`[1]`)}}, members("d"), 1, "cannot read"},
		{"an older release not a member (aged out)", []fleet.Row{row("a", reads), row("b", old)}, members("a"), 2, "every replica"},
		{"self, whatever its old row says", []fleet.Row{row("me", old)}, members("me"), 2, "every replica"},
	}
	for _, c := range cases {
		got, why := fleetSegmentFormat(c.rows, c.members, "me")
		if got != c.want || !strings.Contains(why, c.why) {
			t.Errorf("%s: format %d (%s), want %d (%s)", c.name, got, why, c.want, c.why)
		}
	}
}

// TestSegmentFormatAuto: with segment_format auto a replica writes format
// 1 while the fleet has a replica of a release that does not read format
// 2, and format 2 once that replica is gone; its own fleet row says what
// it reads and writes.
func TestSegmentFormatAuto(t *testing.T) {
	h := newHooked(t, "segauto", "gtid", func(cfg *config.Config) { cfg.LeaseTTL = time.Second })
	src, stateDB, db, rcv, cfg := h.src, h.stateDB, h.db, h.rcv, h.cfg
	ctx := context.Background()
	if err := state.Migrate(ctx, db, stateDB); err != nil {
		t.Fatal(err)
	}
	// A standby of an earlier release: its row says nothing of formats.
	if err := fleet.Write(ctx, db, stateDB, fleet.Observation{ReplicaID: "old", Kind: fleet.KindEngine, StartedAt: time.Now(),
		Version: "v0.9.0", Payload: inspect.EngineInfo{Instance: "segauto", Role: inspect.RoleStandby}}); err != nil {
		t.Fatal(err)
	}
	e, _ := runEngineE(t, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))

	segments := state.Table(stateDB, "segments")
	formats := func(after string) (map[int]int, string) {
		t.Helper()
		rows, err := db.Query("SELECT id, payload FROM "+segments+" WHERE id > ? ORDER BY id", after)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got, last := map[int]int{}, after
		for rows.Next() {
			var payload []byte
			if err := rows.Scan(&last, &payload); err != nil {
				t.Fatal(err)
			}
			f, err := outbox.SegmentFormatOf(payload)
			if err != nil {
				t.Fatalf("segment %s: %v", last, err)
			}
			got[f]++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got, last
	}
	insert := func(from, to int) {
		for id := from; id < to; id++ {
			if _, err := db.Exec(fmt.Sprintf("INSERT INTO `%s`.t VALUES (%d, %d)", src, id, id)); err != nil {
				t.Fatal(err)
			}
		}
	}

	waitFor(t, "the first look at the fleet", 30*time.Second, func() bool { return e.segFormat() != 0 })
	insert(0, 10)
	waitFor(t, "the first rows", 30*time.Second, func() bool { return rcv.count() >= 10 })
	got, last := formats("")
	if got[1] == 0 || got[2] != 0 {
		t.Fatalf("with a replica of an older release in the fleet: segments by format %v, want format 1 only", got)
	}
	e.mu.Lock()
	f, why := e.segFmt, e.segFmtWhy
	e.mu.Unlock()
	if f != 1 || !strings.Contains(why, "replica old (release v0.9.0) does not read segment format 2") {
		t.Errorf("format %d, why %q", f, why)
	}

	if _, err := fleet.Forget(ctx, db, stateDB, "old"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "format 2 once the old replica is forgotten", 30*time.Second, func() bool { return e.segFormat() == 2 })
	insert(10, 20)
	waitFor(t, "the later rows", 30*time.Second, func() bool { return rcv.count() >= 20 })
	if got, _ := formats(last); got[2] == 0 || got[1] != 0 {
		t.Fatalf("after the old replica left: segments by format %v, want format 2 only", got)
	}
	rcv.mu.Lock()
	dups := rcv.dups
	rcv.mu.Unlock()
	if dups != 0 {
		t.Errorf("%d duplicate deliveries", dups)
	}

	// The replica's own row says it reads format 2 and writes it.
	waitFor(t, "the fleet row to say format 2", 30*time.Second, func() bool {
		rows, err := fleet.Read(ctx, db, stateDB, fleet.KindEngine)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			var info inspect.EngineInfo
			if r.ReplicaID == "r1" && json.Unmarshal(r.Payload, &info) == nil {
				return info.ReadsSegmentFormat == outbox.SegmentFormatRead && info.SegmentFormat == 2
			}
		}
		return false
	})
}
