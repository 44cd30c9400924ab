package engine

import (
	"testing"

	"github.com/cdcout/cdcout/replay"
)

// TestRereadPlaces: the re-read's start before a GTID in either form,
// and its stop at the held record, by GTID of the same source or else by
// file:pos.
func TestRereadPlaces(t *testing.T) {
	point := func(s string) replay.Point {
		p, err := replay.ParsePoint(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	const uuid = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
	for _, c := range []struct {
		gtid    string
		mariadb bool
		want    string
	}{
		{"0-1-42", true, "0-1-41"},
		{"2-7-1", true, "start"},
		{uuid + ":120", false, uuid + ":1-119"},
		{uuid + ":1", false, "start"},
	} {
		if got := gtidStartBefore(point(c.gtid), c.mariadb); got != c.want {
			t.Errorf("start before %s = %q, want %q", c.gtid, got, c.want)
		}
	}
	held := replay.Where{GTID: "0-1-10", File: "binlog.000002", Pos: 500}
	for _, c := range []struct {
		w    replay.Where
		want bool
	}{
		{replay.Where{GTID: "0-1-9", File: "binlog.000002", Pos: 900}, false}, // GTID wins over file:pos
		{replay.Where{GTID: "0-2-10", File: "binlog.000001", Pos: 100}, true}, // same domain, another server
		{replay.Where{GTID: "1-1-50", File: "binlog.000002", Pos: 400}, false},
		{replay.Where{GTID: "1-1-50", File: "binlog.000002", Pos: 500}, true},
		{replay.Where{File: "binlog.000003", Pos: 4}, true},
		{replay.Where{File: "binlog.000001", Pos: 9000}, false},
		{replay.Where{File: "other.000009", Pos: 9000}, false}, // another server's binlog: cannot tell
	} {
		if got := reached(c.w, held); got != c.want {
			t.Errorf("reached(%+v, %+v) = %v, want %v", c.w, held, got, c.want)
		}
	}
}
