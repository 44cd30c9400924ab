package backfill

import (
	"strings"
	"testing"
)

// TestCheckWhere: filters of the row pass; anything that could leave the
// parenthesis, end the statement, read another table, write or wait is
// refused with the reason — also when hidden in case, quotes or spacing.
func TestCheckWhere(t *testing.T) {
	for _, ok := range []string{
		"id > 10",
		"created_at >= '2026-01-01' AND status IN ('new', 'paid')",
		"`select` = 1",                    // a column named select, quoted
		"note LIKE '%; DROP TABLE x --%'", // inside a literal
		"name = 'O''Brien'",
		`name = "double ""quoted"""`,
		"(a = 1 OR b = 2) AND NOT (c <=> NULL)",
		"JSON_EXTRACT(doc, '$.kind') = 'x'",
		"`we``ird` = 2",
		"fromage = 1", // a word that starts with from
	} {
		if err := CheckWhere(ok); err != nil {
			t.Errorf("CheckWhere(%q) = %v, want nil", ok, err)
		}
	}
	for _, tc := range []struct{ where, want string }{
		{"", "empty"},
		{"1=1; DROP TABLE t", "';' is not allowed"},
		{"id > 0) UNION (SELECT 1", "unbalanced ')'"},
		{"id IN (SELECT id FROM other)", `"select" is not allowed`},
		{"id IN (sElEcT id FROM other)", `"select" is not allowed`},
		{"1=1 UNION ALL", `"union" is not allowed`},
		{"SLEEP(10) = 0", `"sleep" is not allowed`},
		{"BENCHMARK(1e9, MD5('x')) = 0", `"benchmark" is not allowed`},
		{"LOAD_FILE('/etc/passwd') IS NOT NULL", `"load_file" is not allowed`},
		{"id = 1 -- comment", "comments"},
		{"id = 1 # comment", "comments"},
		{"id = /* x */ 1", "comments"},
		{"@a := 1", "variables"},
		{"(id = 1", "unbalanced '('"},
		{"name = 'unterminated", "unterminated string"},
		{`name = 'a\' OR (SELECT 1) OR '`, "backslashes"},
		{"`open = 1", "unterminated quoted identifier"},
		{"id = 1 FOR UPDATE", `"for" is not allowed`},
		{"id = 1 LOCK IN SHARE MODE", `"lock" is not allowed`},
		{"1 = 1 INTO OUTFILE '/tmp/x'", `"into" is not allowed`},
		{"GET_LOCK('x', 10) = 1", `"get_lock" is not allowed`},
	} {
		err := CheckWhere(tc.where)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckWhere(%q) = %v, want an error containing %q", tc.where, err, tc.want)
		}
	}
}

// TestReached: GTID sets by containment (both notations), else file and
// offset, with a longer file name sorting after a shorter one.
func TestReached(t *testing.T) {
	for _, tc := range []struct {
		pos, target position
		want        bool
	}{
		{position{Flavor: "mariadb", GTIDSet: "0-1-42"}, position{Flavor: "mariadb", GTIDSet: "0-1-41"}, true},
		{position{Flavor: "mariadb", GTIDSet: "0-1-42"}, position{Flavor: "mariadb", GTIDSet: "0-1-42"}, true},
		{position{Flavor: "mariadb", GTIDSet: "0-1-42"}, position{Flavor: "mariadb", GTIDSet: "0-1-43"}, false},
		{position{Flavor: "mariadb", GTIDSet: "0-1-42"}, position{Flavor: "mariadb", GTIDSet: "0-1-40,1-1-3"}, false},
		{position{Flavor: "mysql", GTIDSet: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100"}, position{Flavor: "mysql", GTIDSet: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-99"}, true},
		{position{Flavor: "mysql", GTIDSet: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-99"}, position{Flavor: "mysql", GTIDSet: "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-100"}, false},
		{position{File: "bin.000009", Pos: 900}, position{File: "bin.000010", Pos: 4}, false},
		{position{File: "bin.000010", Pos: 4}, position{File: "bin.000009", Pos: 900}, true},
		{position{File: "bin.999999", Pos: 4}, position{File: "bin.1000000", Pos: 4}, false},
		{position{File: "bin.000010", Pos: 500}, position{File: "bin.000010", Pos: 500}, true},
		{position{}, position{File: "bin.000001", Pos: 4}, false},
	} {
		if got := reached(tc.pos, tc.target); got != tc.want {
			t.Errorf("reached(%+v, %+v) = %v, want %v", tc.pos, tc.target, got, tc.want)
		}
	}
}
