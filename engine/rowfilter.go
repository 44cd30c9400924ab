package engine

import (
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/filter"
)

// A sink's row filter (config filter:) is applied at enqueue, the
// cheapest place: a change the filter is false for is still claimed, like
// every change of the pipe (so a re-read of it collapses on the claim and
// replicas compare digests as for any other), but no record is written:
// nothing reaches the outbox's segments, the drainer or the sink. It is
// counted in cdcout_changes_filtered_total{sink,result="filtered"}. A
// change the filter cannot be evaluated on (a column it names is not in
// the row, a type mismatch) is dead-lettered with the reason, as
// max_row_bytes does, and the pipe goes on. The filter sees the change
// before drop_columns and the column transforms, so it may test a column
// the sink never receives.

// compileFilter compiles the sink's filter, nil when it has none.
func compileFilter(s config.Sink) (*filter.Filter, error) {
	if s.Filter == "" {
		return nil, nil
	}
	return filter.Compile(s.Filter)
}

// filterOut applies the route's filter to ch: filtered when the sink is
// not to get it, dead (the reason) when the filter could not decide.
func (r *route) filterOut(ch *canonical.Change) (filtered bool, dead string) {
	if r.rowFilter == nil {
		return false, ""
	}
	ok, err := r.rowFilter.Eval(ch)
	result := ""
	switch {
	case err != nil:
		result, dead = "error", "row filter could not be evaluated: "+err.Error()+"; not delivered (fix the filter, then re-sync the row)"
	case !ok:
		result, filtered = "filtered", true
	}
	if result != "" && r.countFiltered != nil {
		r.countFiltered(r.sink, result)
	}
	return filtered, dead
}
