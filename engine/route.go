package engine

import (
	"strings"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/filter"
)

// route is one sink's subscription: which tables and ops it wants and which
// columns it must never see.
type route struct {
	sink   string
	filter config.TableFilter
	ops    map[canonical.Op]bool // nil: every op
	// dropAll are columns removed from every table; dropTable["db.tbl"]
	// from one table only.
	dropAll   map[string]bool
	dropTable map[string]map[string]bool
	// rowFilter is the sink's filter: expression (rowfilter.go), nil for
	// none; countFiltered counts what it keeps from the sink.
	rowFilter     *filter.Filter
	countFiltered func(sink, result string)
}

func newRoute(s config.Sink) (*route, error) {
	f, err := compileFilter(s)
	if err != nil {
		return nil, err
	}
	r := &route{sink: s.Name, filter: s.Tables, rowFilter: f}
	if len(s.Ops) > 0 {
		r.ops = map[canonical.Op]bool{}
		for _, op := range s.Ops {
			letter := canonical.Op(config.OpNames[op])
			r.ops[letter] = true
			if letter == canonical.OpCreate {
				// A backfill's snapshot rows are inserts as far as a
				// subscriber is concerned.
				r.ops[canonical.OpRead] = true
			}
		}
	}
	for _, c := range s.DropColumns {
		parts := strings.Split(c, ".")
		if len(parts) == 1 {
			if r.dropAll == nil {
				r.dropAll = map[string]bool{}
			}
			r.dropAll[c] = true
			continue
		}
		if r.dropTable == nil {
			r.dropTable = map[string]map[string]bool{}
		}
		t := parts[0] + "." + parts[1]
		if r.dropTable[t] == nil {
			r.dropTable[t] = map[string]bool{}
		}
		r.dropTable[t][parts[2]] = true
	}
	return r, nil
}

func (r *route) matches(ch *canonical.Change) bool {
	if r.ops != nil && !r.ops[ch.Op] {
		return false
	}
	return r.filter.Matches(ch.Source.DB, ch.Source.Table)
}

// mask returns ch with the route's dropped columns removed from the row
// images. The key is kept whole: it is what per-key ordering and
// consumers' upserts rely on, so a key column cannot be masked away. The
// original change is never modified (other routes share it).
func (r *route) mask(ch *canonical.Change) *canonical.Change {
	tbl := r.dropTable[ch.Source.DB+"."+ch.Source.Table]
	if len(r.dropAll) == 0 && len(tbl) == 0 {
		return ch
	}
	drop := func(row canonical.Row) canonical.Row {
		if row == nil {
			return nil
		}
		out := make(canonical.Row, len(row))
		for k, v := range row {
			if r.dropAll[k] || tbl[k] {
				continue
			}
			out[k] = v
		}
		return out
	}
	c := *ch
	// The key is kept whole even when a key column is masked: it is read
	// before the images lose columns.
	c.Key, c.KeyCols = ch.KeyRow(), nil
	c.Before = drop(ch.Before)
	c.After = drop(ch.After)
	return &c
}
