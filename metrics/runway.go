package metrics

import (
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

var runwayDesc = prometheus.NewDesc("cdcout_binlog_runway_seconds",
	"Seconds until the source may purge the binlog file holding the checkpoint (+Inf: its settings never purge it); "+
		"absent until this replica, as the enqueue leader, has read it.", nil, nil)

// runwayGauge is cdcout_binlog_runway_seconds, exported only while a
// reading exists: a standby has none, and 0 would read as "purged now".
type runwayGauge struct {
	mu      sync.Mutex
	seconds float64
	known   bool
}

// SetBinlogRunway sets cdcout_binlog_runway_seconds (math.Inf(1) for a
// file never purged); known false removes the series.
func (m *Metrics) SetBinlogRunway(seconds float64, known bool) {
	if m == nil {
		return
	}
	m.runway.mu.Lock()
	m.runway.seconds, m.runway.known = seconds, known
	m.runway.mu.Unlock()
}

func (g *runwayGauge) Describe(ch chan<- *prometheus.Desc) { ch <- runwayDesc }

func (g *runwayGauge) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	seconds, known := g.seconds, g.known
	g.mu.Unlock()
	if known && !math.IsNaN(seconds) {
		ch <- prometheus.MustNewConstMetric(runwayDesc, prometheus.GaugeValue, seconds)
	}
}
