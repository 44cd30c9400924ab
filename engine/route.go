package engine

import (
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
	// tf are the column transforms (transform.go).
	tf transforms
	// rowFilter is the sink's filter: expression (rowfilter.go), nil for
	// none; countFiltered counts what it keeps from the sink.
	rowFilter     *filter.Filter
	countFiltered func(sink, result string)
	// transactions: the sink wants transaction metadata (txmeta.go).
	transactions bool
	// ddl: the sink wants schema-change records (ddl.go).
	ddl bool
}

func newRoute(s config.Sink) (*route, error) {
	f, err := compileFilter(s)
	if err != nil {
		return nil, err
	}
	r := &route{sink: s.Name, filter: s.Tables, rowFilter: f, transactions: s.Transactions, ddl: s.DDL}
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
	r.tf = newTransforms(s)
	return r, nil
}

func (r *route) matches(ch *canonical.Change) bool {
	if ch.Op == canonical.OpDDL {
		return false // routed by ddlPlace
	}
	if r.ops != nil && !r.ops[ch.Op] {
		return false
	}
	return r.filter.Matches(ch.Source.DB, ch.Source.Table)
}
