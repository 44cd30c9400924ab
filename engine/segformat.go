package engine

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/outbox"
)

// segmentFormat is what segment_format says: a fixed format, or 0 for
// auto.
func segmentFormat(setting string) int {
	switch setting {
	case "2":
		return outbox.SegmentFormat2
	case config.SegmentFormatAuto:
		return 0
	}
	return outbox.SegmentFormat1
}

// watchSegmentFormat keeps the store's segment format, under
// segment_format auto, at the newest one every member of the instance's
// fleet reads: format 2 is a quarter smaller for the state database to
// parse and log, but a replica of a release before it halts a pipe at the
// first such segment it drains (nothing lost, nothing moving until it is
// upgraded). It looks at once and then at every fleet heartbeat, so a
// replica of an older release that joins is seen within one (its first
// write is at its start). Until the first look succeeds the store writes
// format 1, which every release reads.
func (e *Engine) watchSegmentFormat(ctx context.Context, db *sql.DB, store *outbox.Store) {
	every := heartbeatEvery(e.cfg.LeaseTTL)
	t := time.NewTimer(0)
	defer t.Stop()
	failing, looked := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(every)
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		f, why, err := readFleetSegmentFormat(lctx, db, e.cfg.StateDB, e.cfg.Instance, e.cfg.ReplicaID)
		cancel()
		if err != nil {
			if ctx.Err() == nil && !failing {
				e.log.Warn("segment format: could not read the fleet; segments keep their current format",
					zap.Int("segment_format", store.SegmentFormat()), zap.Error(err))
			}
			failing = true
			continue
		}
		failing = false
		if was := store.SegmentFormat(); f != was || !looked {
			store.SetSegmentFormat(f)
			e.log.Info("segment format chosen (segment_format auto)", zap.Int("segment_format", f), zap.Int("was", was), zap.String("why", why))
		}
		e.setSegFormat(f, why)
		looked = true
	}
}

// readFleetSegmentFormat reads the instance's fleet and decides with
// fleetSegmentFormat.
func readFleetSegmentFormat(ctx context.Context, db *sql.DB, schema, instance, self string) (int, string, error) {
	all, err := fleet.Read(ctx, db, schema, fleet.KindEngine)
	if err != nil {
		return 0, "", err
	}
	// Stopped replicas' rows count too (unlike the fleet view's
	// membership): one may be started again as it was.
	rows, _ := inspect.InstanceRows(all, instance)
	members, err := fleet.Members(ctx, db, schema, instance, rows, fleet.DefaultStaleAfter)
	if err != nil {
		return 0, "", err
	}
	f, why := fleetSegmentFormat(rows, members, self)
	return f, why, nil
}

// fleetSegmentFormat is the newest segment format every member reads, as
// its fleet row (in rows) says, and why: a member without a row, with a
// row this release cannot read or from a release that does not say holds
// it at format 1. self, this replica, reads it whatever its row (perhaps
// an earlier generation's) says.
func fleetSegmentFormat(rows []fleet.Row, members []fleet.Member, self string) (int, string) {
	byID := make(map[string]fleet.Row, len(rows))
	for _, r := range rows {
		byID[r.ReplicaID] = r
	}
	for _, m := range members {
		if m.ID == self {
			continue
		}
		r, ok := byID[m.ID]
		if !ok {
			return outbox.SegmentFormat1, fmt.Sprintf("replica %s holds a lease but has written no fleet row", m.ID)
		}
		var info inspect.EngineInfo
		if len(r.Payload) == 0 || json.Unmarshal(r.Payload, &info) != nil {
			return outbox.SegmentFormat1, fmt.Sprintf("replica %s (release %s) wrote a fleet row this release cannot read", m.ID, r.Version)
		}
		if info.ReadsSegmentFormat < outbox.SegmentFormat2 {
			return outbox.SegmentFormat1, fmt.Sprintf("replica %s (release %s) does not read segment format 2", m.ID, r.Version)
		}
	}
	return outbox.SegmentFormat2, "every replica of the fleet reads it"
}

// segFormat is the segment format the store writes, 0 before auto's
// first look.
func (e *Engine) segFormat() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.segFmt
}

func (e *Engine) setSegFormat(f int, why string) {
	e.mu.Lock()
	e.segFmt, e.segFmtWhy = f, why
	e.mu.Unlock()
}
