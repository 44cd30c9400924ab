package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/replay"
)

// TestReplayReread: retention deletes hook's first 5 records (and
// other's), 3 more changes are delivered, and a replay of hook from the
// first change's GTID re-reads the 5 from the binlog — under ids derived
// from their place, not the deleted ones — then re-delivers the 3 held
// ones under their original ids, each key's in binlog order. A replay
// from the first change's commit time gets the same 8 under the same
// ids. other gets nothing of either. A range from a binlog the server
// purged fails the replay, naming the oldest binlog the server has. Once
// retention deleted all of hook's records, a replay re-reads all 8 up to
// the log's end.
func TestReplayReread(t *testing.T) {
	hook, other := newLogReceiver(t), newLogReceiver(t)
	s := newSource(t, "rr", "id INT PRIMARY KEY, v INT", func(cfg *config.Config) {
		cfg.Sinks = []config.Sink{{Name: "hook", URL: hook.srv.URL}, {Name: "other", URL: other.srv.URL}}
	})
	runEngine(t, s.cfg, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := s.db.Exec(strings.ReplaceAll(q, "{t}", "`"+s.src+"`.t"), args...); err != nil {
			t.Fatal(err)
		}
	}
	// Commit times may be whole seconds: the first change is two seconds
	// after the server opened its binlog, for the time range to find it.
	t0 := time.Now().Unix()
	waitFor(t, "two seconds on", 4*time.Second, func() bool { return time.Now().Unix() >= t0+2 })
	for id := 1; id <= 3; id++ {
		exec("INSERT INTO {t} VALUES (?, 0)", id)
	}
	exec("UPDATE {t} SET v = 1 WHERE id = 1")
	exec("UPDATE {t} SET v = 1 WHERE id = 2")
	waitFor(t, "both sinks get the first 5 changes", 30*time.Second, func() bool { return hook.count() == 5 && other.count() == 5 })
	old := hook.since(0)
	var first struct {
		Source struct {
			GTID string `json:"gtid"`
			TsMs int64  `json:"ts_ms"`
		} `json:"source"`
	}
	recs := records(t, s.db, s.stateDB, "rr:%:hook")
	slices.SortFunc(recs, func(a, b outbox.StoredRecord) int { return strings.Compare(a.ID, b.ID) })
	if len(recs) != 5 || json.Unmarshal(recs[0].Payload, &first) != nil || first.Source.GTID == "" {
		t.Fatalf("hook's records: %d, %s", len(recs), recs[0].Payload)
	}

	// Retention deletes every delivered record, and marks it.
	ctx := context.Background()
	sweepRetention(ctx, t, s)
	if got := len(records(t, s.db, s.stateDB, "rr:%:hook")); got != 0 {
		t.Fatalf("retention left %d of hook's records", got)
	}
	exec("UPDATE {t} SET v = 2 WHERE id = 1")
	exec("UPDATE {t} SET v = 2 WHERE id = 3")
	exec("DELETE FROM {t} WHERE id = 2")
	waitFor(t, "both sinks get the 3 later changes", 30*time.Second, func() bool { return hook.count() == 8 && other.count() == 8 })
	held := hook.since(5)

	reader := inspect.Reader{DB: s.db, Schema: s.stateDB, Instance: "rr"}
	replayed := func(from string) []received {
		t.Helper()
		n := hook.count()
		st, err := reader.StartReplay(ctx, "hook", from, "", "test")
		if err != nil {
			t.Fatal(err)
		}
		waitReplayStatus(t, reader, st.ID, replay.Done)
		got := hook.since(n)
		checkRereadDelivery(t, got, old, held)
		return got
	}
	byGTID := replayed(first.Source.GTID)
	byTime := replayed(time.UnixMilli(first.Source.TsMs).UTC().Format(time.RFC3339Nano))
	ids := func(ps []received) map[string]string {
		m := map[string]string{}
		for _, p := range ps {
			m[p.place] = p.id
		}
		return m
	}
	if a, b := ids(byGTID), ids(byTime); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("the two replays' ids differ:\n%v\n%v", a, b)
	}
	if got := other.count(); got != 8 {
		t.Errorf("sink other got %d deliveries, want its 8: a replay of hook must not touch it", got)
	}

	// A binlog older than the server has.
	var oldest string
	var size any
	rows, err := s.db.Query("SHOW BINARY LOGS")
	if err != nil {
		t.Fatal(err)
	}
	cols, _ := rows.Columns()
	if rows.Next() {
		dest := []any{&oldest, &size}
		for len(dest) < len(cols) {
			dest = append(dest, new(any))
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
	}
	rows.Close()
	base := oldest[:strings.LastIndexByte(oldest, '.')+1]
	st, err := reader.StartReplay(ctx, "hook", base+"000000:4", "", "test")
	if err != nil {
		t.Fatal(err)
	}
	waitReplayStatus(t, reader, st.ID, replay.Failed)
	list, err := reader.Replays(ctx)
	if err != nil || len(list) == 0 || list[0].ID != st.ID || len(list[0].Pipes) != 1 {
		t.Fatalf("replays: %+v, %v", list, err)
	}
	if msg := list[0].Pipes[0].LastError; !strings.Contains(msg, "its oldest binary log is "+oldest) {
		t.Errorf("failed replay's error %q does not name the oldest binlog %s", msg, oldest)
	}

	// Retention deletes the rest (no replay runs): the pipe holds
	// nothing, and a replay re-reads all 8, up to the log's end, none
	// under its deleted id, the first 5 under the same ids as before.
	sweepRetention(ctx, t, s)
	if got := len(records(t, s.db, s.stateDB, "rr:%:hook")); got != 0 {
		t.Fatalf("retention left %d of hook's records", got)
	}
	n := hook.count()
	if st, err = reader.StartReplay(ctx, "hook", first.Source.GTID, "", "test"); err != nil {
		t.Fatal(err)
	}
	waitReplayStatus(t, reader, st.ID, replay.Done)
	all := hook.since(n)
	checkRereadDelivery(t, all, append(slices.Clone(old), held...), nil)
	before := ids(byGTID)
	for _, p := range all {
		if id, ok := before[p.place]; ok && slices.ContainsFunc(old, func(o received) bool { return o.place == p.place }) && id != p.id {
			t.Errorf("re-read %s under %s, before under %s", p.place, p.id, id)
		}
	}
}

// checkRereadDelivery: got are old's changes (by place) under new ids,
// then held's under their own, each once, each key's in binlog order.
func checkRereadDelivery(t *testing.T, got, old, held []received) {
	t.Helper()
	want := map[string]string{} // place → id, "" for a re-read one
	for _, p := range old {
		want[p.place] = ""
	}
	for _, p := range held {
		want[p.place] = p.id
	}
	oldIDs := map[string]bool{}
	for _, p := range old {
		oldIDs[p.id] = true
	}
	last := map[string]string{}
	for _, g := range got {
		id, ok := want[g.place]
		switch {
		case !ok:
			t.Errorf("replayed %+v: not in the range, or twice", g)
		case id == "" && oldIDs[g.id]:
			t.Errorf("re-read change %+v under its deleted record's id", g)
		case id != "" && id != g.id:
			t.Errorf("held change %+v not under its id %s", g, id)
		}
		delete(want, g.place)
		if prev := last[g.key]; g.place < prev {
			t.Errorf("key %s: %s replayed after %s", g.key, g.place, prev)
		}
		last[g.key] = g.place
	}
	if len(want) > 0 {
		t.Errorf("%d changes were not replayed: %v", len(want), want)
	}
}

func waitReplayStatus(t *testing.T, r inspect.Reader, id int64, want string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("replay %d is %s", id, want), 30*time.Second, func() bool {
		list, err := r.Replays(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range list {
			if st.ID == id {
				return st.Status == want
			}
		}
		return false
	})
}
