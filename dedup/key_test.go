package dedup

import (
	"strings"
	"testing"
)

func TestComposeKeys(t *testing.T) {
	digest := strings.Repeat("ab", 32)
	for _, tc := range []struct{ got, want string }{
		{GTIDKey("0-1-42", 3), "g:0-1-42:3"},
		{GTIDKey("3E11FA47-71CA-11E1-9E33-C80AA9429562:23", 0), "g:3E11FA47-71CA-11E1-9E33-C80AA9429562:23:0"},
		{DigestKey(digest, 0), "d:" + digest + ":0"},
		{DigestKey(digest, 12), "d:" + digest + ":12"},
		{BackfillKey("bf1", "cafe"), "b:bf1:cafe"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestParseChangeKey(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		want ParsedKey
	}{
		{"g:0-1-42:3", true, ParsedKey{Kind: 'g', A: "0-1-42", N: 3}},
		{"g:uuid-x:23:0", true, ParsedKey{Kind: 'g', A: "uuid-x:23", N: 0}},
		{"d:abc:0", true, ParsedKey{Kind: 'd', A: "abc", N: 0}},
		{"d:abc:17", true, ParsedKey{Kind: 'd', A: "abc", N: 17}},
		{"b:bf-1:cafe", true, ParsedKey{Kind: 'b', A: "bf-1", B: "cafe"}},
		{"b:bf:1:cafe", true, ParsedKey{Kind: 'b', A: "bf:1", B: "cafe"}},
		{"", false, ParsedKey{}},
		{"d:abc", false, ParsedKey{}},
		{"d:abc:", false, ParsedKey{}},
		{"d::3", false, ParsedKey{}},
		{"d:a:b:3", false, ParsedKey{}}, // digests have no colon
		{"d:abc:-1", false, ParsedKey{}},
		{"d:abc:+1", false, ParsedKey{}},
		{"d:abc:01", false, ParsedKey{}}, // one spelling per count
		{"d:abc:1x", false, ParsedKey{}},
		{"d:abc:1234567890123456789", false, ParsedKey{}},
		{"x:abc:1", false, ParsedKey{}},
		{"dd:abc:1", false, ParsedKey{}},
		{"g:0-1-1:2 ", false, ParsedKey{}},
		{"g:0-1\n-1:2", false, ParsedKey{}},
		{"d:" + strings.Repeat("a", MaxKeyLen) + ":1", false, ParsedKey{}},
	} {
		got, ok := ParseChangeKey(tc.in)
		if ok != tc.ok || got != tc.want {
			t.Errorf("ParseChangeKey(%q) = %+v, %v; want %+v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
		if ok {
			if s := got.String(); s != tc.in {
				t.Errorf("ParseChangeKey(%q).String() = %q", tc.in, s)
			}
		}
	}
}

func FuzzParseChangeKey(f *testing.F) {
	for _, s := range []string{"g:0-1-42:3", "d:abc:0", "b:x:y", "g:u:1:2", "d:abc:01", "", "::::"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, ok := ParseChangeKey(s)
		if !ok {
			return
		}
		// Whatever parses must compose back to itself: a key has one
		// spelling, or two replicas could claim one change twice.
		if got := p.String(); got != s {
			t.Fatalf("ParseChangeKey(%q).String() = %q", s, got)
		}
		if p.N < 0 {
			t.Fatalf("negative count from %q", s)
		}
		q, ok := ParseChangeKey(p.String())
		if !ok || q != p {
			t.Fatalf("reparse of %q = %+v, %v", s, q, ok)
		}
	})
}

func TestGTIDUnitOf(t *testing.T) {
	for key, want := range map[string]string{
		"g:0-1-42:0":   "g:0-1-42:@0",
		"g:0-1-42:99":  "g:0-1-42:@0",
		"g:0-1-42:100": "g:0-1-42:@1",
		"g:3E11FA47-71CA-11E1-9E33-C80AA9429562:23:250": "g:3E11FA47-71CA-11E1-9E33-C80AA9429562:23:@2",
		"d:" + strings.Repeat("a", 64) + ":0":           "",
		"b:bf1:abc":                                     "",
		"g::5":                                          "",
		"garbage":                                       "",
	} {
		if got := GTIDUnitOf(key); got != want {
			t.Errorf("GTIDUnitOf(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestBackfillUnit(t *testing.T) {
	a, b := BackfillUnit("bf1", "", "AAE="), BackfillUnit("bf1", "AAE=", "AAI=")
	if a == b || a != BackfillUnit("bf1", "", "AAE=") || !IsBackfillUnit(a) || len(a) > MaxKeyLen {
		t.Fatalf("units %q and %q", a, b)
	}
	if IsBackfillUnit(BackfillKey("bf1", "cafe")) || IsBackfillUnit(GTIDUnitOf("g:0-1-2:3")) {
		t.Fatal("a change key or a GTID unit taken for a backfill unit")
	}
	if _, ok := ParseChangeKey(a); ok {
		t.Fatal("a unit parses as a change key")
	}
}
