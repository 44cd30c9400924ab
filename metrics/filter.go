package metrics

import "github.com/prometheus/client_golang/prometheus"

func newFilteredCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cdcout_changes_filtered_total",
		Help: "Changes a sink's row filter decided on without delivering them, by sink and result: filtered (false: claimed, not delivered) or error (could not evaluate: dead-lettered with the reason).",
	}, []string{"sink", "result"})
}

// ObserveFiltered counts a change a sink's row filter kept from the sink
// (result "filtered") or could not evaluate ("error").
func (m *Metrics) ObserveFiltered(sink, result string) {
	if m == nil {
		return
	}
	m.filtered.WithLabelValues(sink, result).Inc()
}
