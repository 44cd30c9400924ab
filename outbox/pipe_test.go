package outbox

import "testing"

func TestPipeName(t *testing.T) {
	for _, c := range []struct {
		db, table string
	}{{"app", "users"}, {"app", "odd:name"}} {
		p := PipeName("main", c.db, c.table, "hook")
		inst, table, sink, ok := SplitPipe(p)
		if !ok || inst != "main" || table != c.db+"."+c.table || sink != "hook" {
			t.Errorf("SplitPipe(%q) = %q, %q, %q, %v", p, inst, table, sink, ok)
		}
	}
	for _, bad := range []string{"", "main", "main:app.users"} {
		if _, _, _, ok := SplitPipe(bad); ok {
			t.Errorf("SplitPipe(%q) ok, want not a pipe name", bad)
		}
	}
}
