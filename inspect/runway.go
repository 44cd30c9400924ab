package inspect

import (
	"fmt"
	"math"
	"time"

	"github.com/cdcout/cdcout/binlog"
)

// RunwayView is the binlog runway in /v1/source (binlogRunway) and the
// dashboard: the reading, and the seconds left now — null when the server
// never purges the file (the metric is +Inf then).
type RunwayView struct {
	*binlog.Runway
	Seconds *float64 `json:"seconds"`
	Error   string   `json:"error,omitempty"`
}

// runwayView renders src's runway at now; nil when there is neither a
// reading nor an error.
func runwayView(src SourceStatus, now time.Time) *RunwayView {
	if src.Runway == nil && src.RunwayError == "" {
		return nil
	}
	v := &RunwayView{Runway: src.Runway, Error: src.RunwayError}
	if src.Runway != nil && !src.Runway.Never {
		secs := src.Runway.Seconds(now)
		v.Seconds = &secs
	}
	return v
}

// runwayShort is /readyz's reason when the runway is under the configured
// minimum, else "".
func (s *Server) runwayShort(src SourceStatus, now time.Time) string {
	r := src.Runway
	if s.cfg.RunwayMin <= 0 || r == nil {
		return ""
	}
	left := r.Seconds(now)
	if math.IsInf(left, 1) || left >= s.cfg.RunwayMin.Seconds() {
		return ""
	}
	return fmt.Sprintf("binlog runway %s below %s: the server may purge %s (it holds the checkpoint) at %s (%s)",
		(time.Duration(left) * time.Second).String(), s.cfg.RunwayMin, r.File, r.PurgeAt.UTC().Format(time.RFC3339), r.Limit)
}

// fleetRunway is the runway the live leader's fleet row reports, for
// `cdcout status`; nil without one.
func fleetRunway(f Fleet, now time.Time) *RunwayView {
	for _, r := range f.Replicas {
		if r.Stale || r.Payload.Role != "leader" || r.Payload.BinlogRunway == nil {
			continue
		}
		return runwayView(SourceStatus{Runway: r.Payload.BinlogRunway}, now)
	}
	return nil
}
