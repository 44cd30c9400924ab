package filter

import (
	"strings"
	"testing"

	"github.com/cdcout/cdcout/canonical"
)

func TestCompileErrors(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`op == `, "Syntax error"},
		{`op == 1`, "no matching overload"},
		{`nope == "c"`, "undeclared reference to 'nope'"},
		{`after`, "yields map(string, dyn); a filter must yield a bool"},
		{`op + "x"`, "yields string"},
	} {
		if _, err := Compile(tc.expr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Compile(%q) = %v, want an error containing %q", tc.expr, err, tc.want)
		}
	}
}

func TestEval(t *testing.T) {
	ins := &canonical.Change{Op: canonical.OpCreate, After: canonical.Row{"id": int64(1), "amount": "12.50", "n": int64(7), "u": uint64(3),
		"doc": canonical.RawJSON(`{"tier":"gold","tags":["a","b"]}`), "f": 1.5, "note": nil},
		Source: canonical.Source{DB: "shop", Table: "orders", Pos: 4, TsMs: 1000}}
	del := &canonical.Change{Op: canonical.OpDelete, Before: canonical.Row{"id": int64(2), "n": int64(1)}, Source: canonical.Source{DB: "shop", Table: "orders"}}
	for _, tc := range []struct {
		expr string
		ch   *canonical.Change
		want bool
		err  string
	}{
		{`op == "c"`, ins, true, ""},
		{`after.n > 5 && source.table == "orders"`, ins, true, ""},
		{`after.u == 3u`, ins, true, ""},
		{`double(after.amount) >= 12.5`, ins, true, ""},
		{`after.doc.tier == "gold" && "b" in after.doc.tags`, ins, true, ""},
		{`after.note == null`, ins, true, ""},
		{`after.f < 2.0`, ins, true, ""},
		{`source.pos == 4 && source.ts_ms == 1000`, ins, true, ""},
		{`op == "d" || after.n > 100`, del, true, ""},
		{`op != "d" && after.n > 100`, del, false, ""},
		{`after.missing > 1`, ins, false, "no such key: missing"},
		{`after.n > 1`, del, false, ""}, // after is null on a delete
		{`after.amount > 1`, ins, false, "no such overload"},
	} {
		f, err := Compile(tc.expr)
		if err != nil {
			t.Fatalf("Compile(%q): %v", tc.expr, err)
		}
		got, err := f.Eval(tc.ch)
		if tc.err != "" || (tc.expr == `after.n > 1`) {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: Eval = %v, %v; want an error containing %q", tc.expr, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: Eval = %v, %v; want %v", tc.expr, got, err, tc.want)
		}
	}
}
