package inspect

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/binlog"
)

// TestRunwayInSourceAndMetrics: /v1/source and /metrics show the binlog
// runway — seconds left (null and +Inf when never purged), nothing while
// there is no reading (a standby), the error when reading failed.
func TestRunwayInSourceAndMetrics(t *testing.T) {
	deps := testDeps(t)
	var src SourceStatus
	deps.Source = func() SourceStatus { return src }
	hs := httptest.NewServer(New(Config{}, deps).Handler())
	defer hs.Close()
	metric := func() string {
		_, body := get(t, hs.URL+"/metrics")
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "cdcout_binlog_runway_seconds ") {
				return strings.TrimPrefix(l, "cdcout_binlog_runway_seconds ")
			}
		}
		return ""
	}
	var view struct {
		BinlogRunway *struct {
			Seconds *float64  `json:"seconds"`
			Never   bool      `json:"never"`
			File    string    `json:"file"`
			Limit   string    `json:"limit"`
			PurgeAt time.Time `json:"purgeAt"`
			Error   string    `json:"error"`
		} `json:"binlogRunway"`
	}

	src = SourceStatus{Following: true}
	getJSON(t, hs.URL+"/v1/source", &view)
	if view.BinlogRunway != nil || metric() != "" {
		t.Fatalf("standby: binlogRunway %+v, metric %q; want neither", view.BinlogRunway, metric())
	}

	src = SourceStatus{Connected: true, Runway: &binlog.Runway{File: "b.000002", Never: true, Limit: "none (binlogs never expire)"}}
	getJSON(t, hs.URL+"/v1/source", &view)
	if r := view.BinlogRunway; r == nil || r.Seconds != nil || !r.Never || r.File != "b.000002" {
		t.Fatalf("never purged: binlogRunway %+v, want seconds null, never true", r)
	}
	if got := metric(); got != "+Inf" {
		t.Fatalf("never purged: metric %q, want +Inf", got)
	}

	purge := time.Now().Add(90 * time.Minute).Truncate(time.Second)
	src.Runway = &binlog.Runway{File: "b.000002", PurgeAt: purge, Limit: "binlog_expire_logs_seconds=5400"}
	view.BinlogRunway = nil
	getJSON(t, hs.URL+"/v1/source", &view)
	if r := view.BinlogRunway; r == nil || r.Seconds == nil || *r.Seconds > 5400 || *r.Seconds < 5390 || !r.PurgeAt.Equal(purge) || r.Limit != "binlog_expire_logs_seconds=5400" {
		t.Fatalf("binlogRunway %+v, want ~5400 s until %s", r, purge)
	}
	if got := metric(); !strings.HasPrefix(got, "539") && !strings.HasPrefix(got, "540") {
		t.Fatalf("metric %q, want ~5400", got)
	}

	src = SourceStatus{Connected: true, RunwayError: "binlog runway: read when b.000003 started: access denied"}
	view.BinlogRunway = nil
	getJSON(t, hs.URL+"/v1/source", &view)
	if r := view.BinlogRunway; r == nil || !strings.Contains(r.Error, "access denied") || r.Seconds != nil {
		t.Fatalf("failed reading: binlogRunway %+v, want the error", r)
	}
	if got := metric(); got != "" {
		t.Fatalf("failed reading: metric %q, want none", got)
	}
}
