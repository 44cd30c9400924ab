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
	// The parts one at a time, for any name: the whole name when it has
	// no ':' (a sink's tests name pipes freely).
	for _, c := range []struct{ pipe, inst, sink string }{
		{"main:app.odd:name:hook", "main", "hook"}, {"p", "p", "p"}, {"a:b", "a", "b"}, {"", "", ""},
	} {
		if got := PipeInstance(c.pipe); got != c.inst {
			t.Errorf("PipeInstance(%q) = %q, want %q", c.pipe, got, c.inst)
		}
		if got := PipeSink(c.pipe); got != c.sink {
			t.Errorf("PipeSink(%q) = %q, want %q", c.pipe, got, c.sink)
		}
	}
}
