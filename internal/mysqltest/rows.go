package mysqltest

import "testing"

// SameRows compares a consumer's view of a table (got, rows by key, as
// the deliveries left them) with the table's own rows (want): it reports
// the first 10 keys that differ — a row missing, different or still there
// after its delete — and then fails the test with how many there are.
// who names the consumer in the messages.
func SameRows[V comparable](tb testing.TB, who string, got, want map[int64]V) {
	tb.Helper()
	bad := 0
	for id, w := range want {
		if g, ok := got[id]; !ok || g != w {
			if bad++; bad <= 10 {
				tb.Errorf("key %d: %s has %#v (present %v), table has %#v", id, who, g, ok, w)
			}
		}
	}
	for id, g := range got {
		if _, ok := want[id]; !ok {
			if bad++; bad <= 10 {
				tb.Errorf("key %d: %s has %#v, deleted from the table", id, who, g)
			}
		}
	}
	if bad > 0 {
		tb.Fatalf("%d keys differ between the %s and the table", bad, who)
	}
}
