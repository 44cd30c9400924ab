package binlog

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

func TestParseFrom(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want From
	}{
		{"", From{Kind: FromNow}},
		{"now", From{Kind: FromNow}},
		{"START", From{Kind: FromStart}},
		{"0-1-42", From{Kind: FromGTID, GTIDSet: "0-1-42", Flavor: "mariadb"}},
		{"0-1-42,1-2-7", From{Kind: FromGTID, GTIDSet: "0-1-42,1-2-7", Flavor: "mariadb"}},
		{"3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5", From{Kind: FromGTID, GTIDSet: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5", Flavor: "mysql"}},
		{"binlog.000003:1234", From{Kind: FromFilePos, File: "binlog.000003", Pos: 1234}},
		{"mysql-bin.000001:0", From{Kind: FromFilePos, File: "mysql-bin.000001", Pos: 4}},
	} {
		got, err := ParseFrom(tc.in)
		if err != nil {
			t.Errorf("ParseFrom(%q): %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseFrom(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	for _, bad := range []string{"yesterday", "binlog.000001:x", "0-1", "3e11fa47-71ca-11e1-9e33-c80aa9429562:x", "a b:5"} {
		if _, err := ParseFrom(bad); err == nil {
			t.Errorf("ParseFrom(%q) accepted", bad)
		}
	}
}

// firstValue opens a stream with cfg, inserts a marker row and returns the
// v values of db.t's inserts seen up to the marker.
func valuesFrom(t *testing.T, srv *mysqltest.Server, cfg Config, db string, marker int) []int64 {
	t.Helper()
	s := openStream(t, cfg)
	c := collect(t, s)
	srv.Exec(t, "INSERT INTO `"+db+"`.t VALUES ("+itoa(marker)+")")
	evs := c.waitFor(t, func(evs []Event) bool {
		for _, ch := range changesOf(evs) {
			if ch.After["v"] == int64(marker) {
				return true
			}
		}
		return false
	}, "marker %d", marker)
	var out []int64
	for _, ch := range changesOf(evs) {
		v, _ := ch.After["v"].(int64)
		out = append(out, v)
		if v == int64(marker) {
			break
		}
	}
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

func equalInts(a []int64, b ...int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestStartPositions(t *testing.T) {
	srv := mysqltest.Shared(t)
	db := srv.CreateDB(t, "pos")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (v INT PRIMARY KEY)", "INSERT INTO `"+db+"`.t VALUES (1)")
	conn := srv.Open(t)
	gtidAfter1 := mysqltest.GTIDPos(t, conn)
	file, pos := srv.BinlogStatus(t)
	srv.Exec(t, "INSERT INTO `"+db+"`.t VALUES (2)")

	t.Run("now", func(t *testing.T) {
		cfg := testConfig(t, srv, db)
		if got := valuesFrom(t, srv, cfg, db, 10); !equalInts(got, 10) {
			t.Fatalf("from now: %v, want [10]", got)
		}
	})
	t.Run("gtid", func(t *testing.T) {
		cfg := testConfig(t, srv, db)
		cfg.From = gtidAfter1
		if got := valuesFrom(t, srv, cfg, db, 11); !equalInts(got, 2, 10, 11) {
			t.Fatalf("from %s: %v, want [2 10 11]", gtidAfter1, got)
		}
	})
	t.Run("filepos", func(t *testing.T) {
		cfg := testConfig(t, srv, db)
		cfg.From = file + ":" + strconv.FormatUint(uint64(pos), 10)
		if got := valuesFrom(t, srv, cfg, db, 12); !equalInts(got, 2, 10, 11, 12) {
			t.Fatalf("from %s: %v, want [2 10 11 12]", cfg.From, got)
		}
	})
	t.Run("start", func(t *testing.T) {
		cfg := testConfig(t, srv, db)
		cfg.From = "start"
		if got := valuesFrom(t, srv, cfg, db, 13); !equalInts(got, 1, 2, 10, 11, 12, 13) {
			t.Fatalf("from start: %v, want [1 2 10 11 12 13]", got)
		}
	})
	t.Run("resume", func(t *testing.T) {
		cfg := testConfig(t, srv, db)
		cfg.Resume = &Position{Flavor: string(srv.Flavor), GTIDSet: gtidAfter1}
		cfg.From = "now" // Resume wins
		if got := valuesFrom(t, srv, cfg, db, 14); !equalInts(got, 2, 10, 11, 12, 13, 14) {
			t.Fatalf("resume %s: %v", gtidAfter1, got)
		}
		cfg = testConfig(t, srv, db)
		cfg.Resume = &Position{Flavor: string(srv.Flavor), File: file, Pos: pos, ServerUUID: "99"}
		err := openErr(t, cfg)
		if !strings.Contains(err.Error(), "belongs to server 99") {
			t.Fatalf("resume on another server: %v", err)
		}
	})
}

// TestPurgedPosition: a position whose binlog is gone is an error naming
// the position and the fix, at Open when it can be seen there and from Run
// when the binlog disappears in between; never a silent jump.
func TestPurgedPosition(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{})
	db := srv.CreateDB(t, "purge")
	srv.Exec(t, "CREATE TABLE `"+db+"`.t (v INT PRIMARY KEY)", "INSERT INTO `"+db+"`.t VALUES (1)")
	conn := srv.Open(t)
	gtid := mysqltest.GTIDPos(t, conn)
	files, err := binlogFiles(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	oldFile := files[len(files)-1]

	// Opened before the purge, run after it.
	early := testConfig(t, srv, db)
	early.From = "start"
	s := openStream(t, early)

	srv.Exec(t, "INSERT INTO `"+db+"`.t VALUES (2)", "FLUSH BINARY LOGS", "INSERT INTO `"+db+"`.t VALUES (3)", "FLUSH BINARY LOGS")
	purgeAll(t, srv)

	for _, from := range []string{gtid, oldFile + ":4", "start"} {
		cfg := testConfig(t, srv, db)
		cfg.From = from
		if from == "start" {
			openStream(t, cfg) // start is whatever is oldest now: allowed
			continue
		}
		t.Logf("from %s", from)
		err := openErr(t, cfg)
		if !errors.Is(err, ErrPositionUnavailable) || !strings.Contains(err.Error(), "--from start") {
			t.Errorf("from %s: %v", from, err)
		}
	}
	cfg := testConfig(t, srv, db)
	cfg.Resume = &Position{Flavor: string(srv.Flavor), GTIDSet: gtid}
	// A checkpoint wins over --from: the advice is the command that
	// discards it, and says what that costs.
	if err := openErr(t, cfg); !errors.Is(err, ErrPositionUnavailable) ||
		!strings.Contains(err.Error(), "cdcout run --reset-position --from start") || !strings.Contains(err.Error(), "--reset-position --from now") ||
		!strings.Contains(err.Error(), "the changes in between are lost") {
		t.Errorf("resume: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = s.Run(ctx, func(context.Context, Event) error { return nil })
	if !errors.Is(err, ErrPositionUnavailable) || !strings.Contains(err.Error(), "--from start") {
		t.Fatalf("run after purge: %v", err)
	}
}

// purgeAll purges every binlog but the current one. MariaDB keeps a file
// until its binlog checkpoint has passed (InnoDB flushed the transactions
// in it), so the purge is repeated until it took effect.
func purgeAll(t *testing.T, srv *mysqltest.Server) {
	t.Helper()
	conn := srv.Open(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		files, err := binlogFiles(context.Background(), conn)
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("binlogs %v never purged", files)
		}
		srv.Exec(t, "PURGE BINARY LOGS TO '"+files[len(files)-1]+"'")
		time.Sleep(100 * time.Millisecond)
	}
}

func TestPositionConversions(t *testing.T) {
	p := Position{Flavor: "mariadb", GTIDSet: "0-1-42,1-2-7", File: "binlog.000002", Pos: 99}
	set, err := p.GTIDs()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := set.String(), "0-1-42,1-2-7"; got != want {
		t.Fatalf("gtids %q, want %q", got, want)
	}
	if got := p.FilePos(); got.Name != "binlog.000002" || got.Pos != 99 {
		t.Fatalf("file pos %v", got)
	}
	m := Position{GTIDSet: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"}
	if set, err := m.GTIDs(); err != nil || set.String() != "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5" {
		t.Fatalf("mysql gtids %v, %v", set, err)
	}
	if set, err := (Position{File: "f", Pos: 4}).GTIDs(); set != nil || err != nil {
		t.Fatalf("no gtids: %v, %v", set, err)
	}
	if got, want := (Position{ServerUUID: "u", File: "f", Pos: 4}).String(), "u/f:4"; got != want {
		t.Fatalf("String %q, want %q", got, want)
	}
}

func TestPositionCovers(t *testing.T) {
	m := func(g string) Position { return Position{Flavor: "mariadb", GTIDSet: g} }
	f := func(file string, pos uint32) Position {
		return Position{Flavor: "mysql", ServerUUID: "u", File: file, Pos: pos}
	}
	for _, c := range []struct {
		a, b Position
		want bool
	}{
		{m("0-1-10"), m("0-1-9"), true},
		{m("0-1-10"), m("0-1-10"), true},
		{m("0-1-9"), m("0-1-10"), false},
		{m("0-1-10,1-1-5"), m("0-1-10"), true},
		{m("0-1-10"), m("0-1-10,1-1-5"), false},
		{f("b.000002", 4), f("b.000001", 900), true},
		{f("b.000001", 900), f("b.000001", 900), true},
		{f("b.000001", 800), f("b.000001", 900), false},
		{f("b.000010", 4), f("b.000009", 4), true},
		{f("b.000001", 4), Position{Flavor: "mysql", ServerUUID: "other", File: "b.000001", Pos: 1}, false},
		{m("0-1-10"), f("b.000001", 4), false},
		{Position{}, Position{}, false},
	} {
		if got := c.a.Covers(c.b); got != c.want {
			t.Errorf("%v.Covers(%v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
