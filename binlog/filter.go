package binlog

import (
	"fmt"
	"strings"
)

// systemDBs are never captured: their rows are server bookkeeping, and
// replaying them elsewhere is meaningless or harmful.
var systemDBs = []string{"mysql", "sys", "information_schema", "performance_schema"}

// tableFilter decides which tables' row changes are emitted. Filtering only
// hides changes: row ordinals are counted before it, so a change's identity
// does not depend on the filter.
type tableFilter struct {
	exact    map[string]bool // "db.tbl"
	dbs      map[string]bool // "db.*"
	tables   map[string]bool // "*.tbl"
	all      bool            // no patterns, or "*.*"
	excluded map[string]bool
}

// newTableFilter parses include patterns ("db.tbl", "db.*", "*.tbl").
func newTableFilter(include, excludeDBs []string) (*tableFilter, error) {
	f := &tableFilter{
		exact:    map[string]bool{},
		dbs:      map[string]bool{},
		tables:   map[string]bool{},
		excluded: map[string]bool{},
	}
	for _, db := range systemDBs {
		f.excluded[db] = true
	}
	for _, db := range excludeDBs {
		if db != "" {
			f.excluded[db] = true
		}
	}
	n := 0
	for _, p := range include {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		n++
		db, tbl, ok := strings.Cut(p, ".")
		if !ok || db == "" || tbl == "" || strings.Contains(tbl, ".") {
			return nil, fmt.Errorf("table pattern %q: want db.table, db.* or *.table", p)
		}
		switch {
		case db == "*" && tbl == "*":
			f.all = true
		case tbl == "*":
			f.dbs[db] = true
		case db == "*":
			f.tables[tbl] = true
		case strings.Contains(db, "*") || strings.Contains(tbl, "*"):
			return nil, fmt.Errorf("table pattern %q: * must stand for a whole name", p)
		default:
			f.exact[db+"."+tbl] = true
		}
	}
	if n == 0 {
		f.all = true
	}
	return f, nil
}

// match reports whether changes of db.tbl are emitted.
func (f *tableFilter) match(db, tbl string) bool {
	if f.excluded[db] {
		return false
	}
	return f.all || f.dbs[db] || f.tables[tbl] || f.exact[db+"."+tbl]
}

// CheckTablePatterns validates include patterns ("db.tbl", "db.*",
// "*.tbl") the way Open will, so a command line can report a bad pattern
// as a usage error before connecting.
func CheckTablePatterns(patterns []string) error {
	_, err := newTableFilter(patterns, nil)
	return err
}
