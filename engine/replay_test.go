package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/control"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/internal/mysqltest"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/replay"
)

// logReceiver is a webhook receiver that logs every request it gets, in
// arrival order, redeliveries included, each with its place in the binlog.
type logReceiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []received
}

// received is one delivery: its id, row key and binlog place
// (file:pos:row, ordered as the binlog is).
type received struct{ id, key, place string }

func newLogReceiver(t *testing.T) *logReceiver {
	r := &logReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var env struct {
			ID     string          `json:"id"`
			Key    json.RawMessage `json:"key"`
			Source struct {
				File string `json:"file"`
				Pos  uint32 `json:"pos"`
				Row  int    `json:"row"`
			} `json:"source"`
		}
		if err := json.Unmarshal(b, &env); err != nil || env.ID == "" || env.ID != req.Header.Get("webhook-id") || env.Source.File == "" {
			t.Errorf("bad delivery: id %q body %s", req.Header.Get("webhook-id"), b)
			w.WriteHeader(400)
			return
		}
		r.mu.Lock()
		r.got = append(r.got, received{env.ID, string(env.Key), fmt.Sprintf("%s:%010d:%03d", env.Source.File, env.Source.Pos, env.Source.Row)})
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// since returns what arrived after the first n requests.
func (r *logReceiver) since(n int) []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got[n:])
}

func (r *logReceiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// stored is one of the replayed sink's records with its place.
type stored struct {
	id, key, gtid, pos string
	commit             time.Time
}

// TestReplay delivers 12 changes (one transaction each, in three
// batches a second apart) to two webhooks, then replays sink hook over a
// GTID range (the flavour's own GTID form), while the sink is paused
// over a time range, and over a binlog position range: hook gets exactly
// the range's records again under their ids, each key's in commit order,
// and other nothing more. A range from before the first record is whole
// (nothing was deleted; TestReplayReread re-reads what was). Retention does not sweep a pipe a
// running replay needs, and marks what it deleted.
func TestReplay(t *testing.T) {
	hook, other := newLogReceiver(t), newLogReceiver(t)
	s := newSource(t, "rp", "id INT PRIMARY KEY, v INT", func(cfg *config.Config) {
		cfg.Sinks = []config.Sink{{Name: "hook", URL: hook.srv.URL}, {Name: "other", URL: other.srv.URL}}
		cfg.HTTPAddr = mysqltest.FreeAddr(t)
		cfg.AdminToken = replayToken
	})
	stop := runEngine(t, s.cfg, nil)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := s.db.Exec(strings.ReplaceAll(q, "{t}", "`"+s.src+"`.t"), args...); err != nil {
			t.Fatal(err)
		}
	}
	nextSecond := func() {
		start := time.Now().Unix()
		waitFor(t, "the clock's next second", 3*time.Second, func() bool { return time.Now().Unix() > start })
	}
	for id := 1; id <= 4; id++ {
		exec("INSERT INTO {t} VALUES (?, 0)", id)
	}
	nextSecond()
	for i := 1; i <= 4; i++ {
		exec("UPDATE {t} SET v = ? WHERE id = ?", i, 1+i%2)
	}
	nextSecond()
	for i := 1; i <= 4; i++ {
		exec("UPDATE {t} SET v = ? WHERE id = ?", 10+i, 3+i%2)
	}
	waitFor(t, "both sinks get the 12 changes", 30*time.Second, func() bool { return hook.count() == 12 && other.count() == 12 })

	var recs []stored
	for _, r := range records(t, s.db, s.stateDB, "rp:%:hook") {
		var env struct {
			Source struct {
				GTID string `json:"gtid"`
				TsMs int64  `json:"ts_ms"`
				File string `json:"file"`
				Pos  uint32 `json:"pos"`
			} `json:"source"`
		}
		if err := json.Unmarshal(r.Payload, &env); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, stored{id: r.ID, key: r.Key, gtid: env.Source.GTID, commit: time.UnixMilli(env.Source.TsMs).UTC(),
			pos: fmt.Sprintf("%s:%d", env.Source.File, env.Source.Pos)})
	}
	slices.SortFunc(recs, func(a, b stored) int { return strings.Compare(a.id, b.id) })
	if len(recs) != 12 || recs[0].gtid == "" {
		t.Fatalf("hook's records: %+v", recs)
	}
	ctx := context.Background()
	reader := inspect.Reader{DB: s.db, Schema: s.stateDB, Instance: "rp"}

	// From before the oldest record, open-ended: nothing was deleted, so
	// the outbox holds the whole range: all 12 again.
	n := hook.count()
	before := gtidMinus(t, recs[0].gtid)
	st, err := reader.StartReplay(ctx, "hook", before, "", "test")
	if err != nil {
		t.Fatal(err)
	}
	waitReplayDone(t, reader, st.ID)
	checkReplayed(t, hook.since(n), recs)
	// A GTID range, records 4 to 8, over the admin API.
	n = hook.count()
	st = postReplay(t, "http://"+s.cfg.HTTPAddr+"/v1/sinks/hook/replay", recs[3].gtid, recs[7].gtid)
	waitReplayDone(t, reader, st.ID)
	checkReplayed(t, hook.since(n), recs[3:8])

	// Another replica, started after this one stopped, has nothing
	// pending to deliver; it carries out the next replay.
	stop()
	cfg2 := *s.cfg
	cfg2.ReplicaID, cfg2.HTTPAddr = "r2", "off"
	runEngine(t, &cfg2, nil)

	// A time range, asked for while the sink is paused: it waits, and
	// retention leaves the pipe alone meanwhile.
	if _, err := control.SetPaused(ctx, s.db, s.stateDB, "rp", "hook", true, "test"); err != nil {
		t.Fatal(err)
	}
	n = hook.count()
	from, to := recs[4].commit, recs[7].commit
	st, err = reader.StartReplay(ctx, "hook", from.Format(time.RFC3339Nano), to.Format(time.RFC3339Nano), "test")
	if err != nil {
		t.Fatal(err)
	}
	list, err := reader.Replays(ctx)
	if err != nil || len(list) == 0 || list[0].ID != st.ID || list[0].Waiting == "" {
		t.Fatalf("replays while paused: %+v, %v", list, err)
	}
	sweepRetention(ctx, t, s)
	if got := len(records(t, s.db, s.stateDB, "rp:%:hook")); got != 12 {
		t.Fatalf("retention left %d of hook's 12 records during its replay", got)
	}
	if got := len(records(t, s.db, s.stateDB, "rp:%:other")); got != 0 {
		t.Fatalf("retention left %d of other's delivered records (retention 1µs, no replay)", got)
	}
	if marks, err := outbox.NewStore(s.db, s.stateDB, nil).RetentionMarks(ctx, "rp:"); err != nil || marks["rp:"+s.src+".t:other"] != newestReceived(t, other) {
		t.Fatalf("retention marks %v, %v: want other's pipe deleted through its newest record", marks, err)
	}
	if got := hook.count(); got != n {
		t.Fatalf("the paused sink got %d records", got-n)
	}
	if _, err := control.SetPaused(ctx, s.db, s.stateDB, "rp", "hook", false, "test"); err != nil {
		t.Fatal(err)
	}
	waitReplayDone(t, reader, st.ID)
	var want []stored
	for _, r := range recs {
		if !r.commit.Before(from) && !r.commit.After(to) {
			want = append(want, r)
		}
	}
	if len(want) < 4 {
		t.Fatalf("time range %s..%s holds %d records; the batches were a second apart", from, to, len(want))
	}
	checkReplayed(t, hook.since(n), want)

	// A binlog position range: records 9 to 11.
	n = hook.count()
	if st, err = reader.StartReplay(ctx, "hook", recs[8].pos, recs[10].pos, "test"); err != nil {
		t.Fatal(err)
	}
	waitReplayDone(t, reader, st.ID)
	checkReplayed(t, hook.since(n), recs[8:11])
	if got := other.count(); got != 12 {
		t.Errorf("sink other got %d requests, want its 12: a replay of hook must not touch it", got)
	}
}

// newestReceived is the newest id r received.
func newestReceived(t *testing.T, r *logReceiver) string {
	t.Helper()
	newest := ""
	for _, g := range r.since(0) {
		newest = max(newest, g.id)
	}
	return newest
}

// checkReplayed: got are exactly want's records, once each, each key's
// in id (commit) order.
func checkReplayed(t *testing.T, got []received, want []stored) {
	t.Helper()
	ids := map[string]bool{}
	for _, w := range want {
		ids[w.id] = true
	}
	last := map[string]string{}
	for _, g := range got {
		if !ids[g.id] {
			t.Errorf("replayed %s, which is not in the range (or twice)", g.id)
		}
		delete(ids, g.id)
		if prev, ok := last[g.key]; ok && g.id < prev {
			t.Errorf("key %s: %s replayed after %s", g.key, g.id, prev)
		}
		last[g.key] = g.id
	}
	if len(ids) > 0 {
		t.Errorf("%d records of the range were not replayed: %v", len(ids), ids)
	}
}

func waitReplayDone(t *testing.T, r inspect.Reader, id int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("replay %d is done", id), 30*time.Second, func() bool {
		list, err := r.Replays(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range list {
			if st.ID == id {
				return st.Status == replay.Done
			}
		}
		return false
	})
}

// gtidMinus is the GTID one sequence number before g, in g's form.
func gtidMinus(t *testing.T, g string) string {
	t.Helper()
	p, err := replay.ParsePoint(g)
	if err != nil || p.Kind != replay.KindGTID || p.Seq < 2 {
		t.Fatalf("GTID %q: %v", g, err)
	}
	if i := strings.LastIndexAny(g, "-:"); i >= 0 {
		return fmt.Sprintf("%s%d", g[:i+1], p.Seq-1)
	}
	t.Fatalf("GTID %q", g)
	return ""
}

const replayToken = "replay-test-admin-token-0123456789"

// postReplay asks for a replay over the admin API, once the server
// answers, and returns what it recorded.
func postReplay(t *testing.T, url, from, to string) replay.Status {
	t.Helper()
	body := fmt.Sprintf(`{"from": %q, "to": %q}`, from, to)
	var (
		code int
		out  []byte
	)
	waitFor(t, "the admin API answers", 10*time.Second, func() bool {
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+replayToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		code = resp.StatusCode
		out, _ = io.ReadAll(resp.Body)
		return true
	})
	var st replay.Status
	if err := json.Unmarshal(out, &st); code != http.StatusAccepted || err != nil || st.ID == 0 {
		t.Fatalf("POST %s: %d %s", url, code, out)
	}
	return st
}

// sweepRetention runs one retention sweep over s's state with a retention
// of 1µs (every delivered record goes), holding the pipes replays hold, as
// the engine's janitor does.
func sweepRetention(ctx context.Context, t *testing.T, s source) {
	t.Helper()
	j, err := outbox.NewJanitor(outbox.JanitorConfig{DB: s.db, Schema: s.stateDB, Retention: time.Microsecond,
		Hold: func(ctx context.Context) (map[string]bool, error) { return replay.HeldPipes(ctx, s.db, s.stateDB) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
}
