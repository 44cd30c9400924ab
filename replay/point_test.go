package replay

import (
	"strings"
	"testing"
	"time"
)

func TestParsePoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		kind Kind
		want string // an error's text when kind is ""
	}{
		{"0-1-42", KindGTID, ""},
		{"3E11FA47-71CA-11E1-9E33-C80AA9429562:23", KindGTID, ""},
		{"mysql-bin.000003:1234", KindFilePos, ""},
		{"2026-12-01T17:00:00.5+01:00", KindTime, ""},
		{"yesterday", "", "is not a GTID"},
		{"0-1-x", "", "is not a GTID"},
	} {
		p, err := ParsePoint(tc.in)
		switch {
		case tc.kind == "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error with %q", tc.in, err, tc.want)
		case tc.kind != "" && (err != nil || p.Kind != tc.kind):
			t.Errorf("%q: %+v, %v; want kind %s", tc.in, p, err, tc.kind)
		}
	}
	p, _ := ParsePoint("3E11FA47-71CA-11E1-9E33-C80AA9429562:23")
	if p.Source != "3e11fa47-71ca-11e1-9e33-c80aa9429562" || p.Seq != 23 {
		t.Errorf("mysql gtid: %+v", p)
	}
}

func TestRangeContains(t *testing.T) {
	r, err := ParseRange("0-1-10", "0-2-20")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gtid         string
		in, after    bool
		startsBefore bool
	}{
		{"0-1-9", false, false, false},
		{"0-1-10", true, false, false},
		{"0-3-20", true, false, true},
		{"0-1-21", false, true, true},
		{"1-1-15", false, false, false}, // another domain: cannot tell
		{"", false, false, false},
	} {
		w := Where{GTID: tc.gtid}
		if got := r.Contains(w); got != tc.in {
			t.Errorf("%s: Contains %v", tc.gtid, got)
		}
		if got := r.After(w); got != tc.after {
			t.Errorf("%s: After %v", tc.gtid, got)
		}
		if got := r.StartsBefore(w); got != tc.startsBefore {
			t.Errorf("%s: StartsBefore %v", tc.gtid, got)
		}
	}
	fp, err := ParseRange("bin.000002:400", "bin.000003:4")
	if err != nil {
		t.Fatal(err)
	}
	if !fp.Contains(Where{File: "bin.000002", Pos: 900}) || fp.Contains(Where{File: "bin.000003", Pos: 5}) || fp.Contains(Where{File: "other.000002", Pos: 900}) {
		t.Error("file:pos range")
	}
	tr, err := ParseRange("2026-12-01T10:00:00Z", "")
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Contains(Where{CommitTime: time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)}) || tr.Contains(Where{CommitTime: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}) {
		t.Error("open time range")
	}
	for _, bad := range [][2]string{{"0-1-9", "0-1-3"}, {"0-1-9", "1-1-12"}, {"0-1-9", "bin.000001:4"}} {
		if _, err := ParseRange(bad[0], bad[1]); err == nil {
			t.Errorf("range %s..%s accepted", bad[0], bad[1])
		}
	}
}
