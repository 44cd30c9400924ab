package engine

import (
	"database/sql"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/internal/mysqltest"
)

// TestBinlogRunway runs a replica against a server of its own with a
// one-hour binlog expiry and binlog_runway_min 2h: /v1/source, /metrics
// and /readyz report the runway of the checkpoint's file and the replica
// as not ready; with the expiry removed the runway is unlimited (+Inf)
// and the replica ready again.
func TestBinlogRunway(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{})
	srv.Exec(t, "SET GLOBAL binlog_expire_logs_seconds = 3600")
	s := newSourceOn(t, srv, "runway", "id INT PRIMARY KEY", func(cfg *config.Config) {
		cfg.HTTPAddr = mysqltest.FreeAddr(t)
		cfg.BinlogRunwayMin = 2 * time.Hour
		cfg.Sinks = []config.Sink{{Name: "out", URL: "file://" + t.TempDir() + "/out.jsonl"}}
	})
	db, cfg := s.db, s.cfg
	runEngineE(t, cfg, zaptest.NewLogger(t), func(e *Engine) { e.runway.every = 500 * time.Millisecond })
	srv.Exec(t, "INSERT INTO `"+s.src+"`.t VALUES (1)")

	type runway struct {
		Seconds *float64 `json:"seconds"`
		Never   bool     `json:"never"`
		File    string   `json:"file"`
		Limit   string   `json:"limit"`
	}
	sourceRunway := func(cond func(runway) bool, what string) runway {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var v struct {
				BinlogRunway *runway `json:"binlogRunway"`
			}
			_, body := get(t, cfg.HTTPAddr, "/v1/source")
			if json.Unmarshal([]byte(body), &v) == nil && v.BinlogRunway != nil && cond(*v.BinlogRunway) {
				return *v.BinlogRunway
			}
			if time.Now().After(deadline) {
				t.Fatalf("/v1/source never showed %s: %s", what, body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	metric := func() float64 {
		t.Helper()
		_, body := get(t, cfg.HTTPAddr, "/metrics")
		for _, l := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(l, "cdcout_binlog_runway_seconds "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("metric line %q: %v", l, err)
				}
				return f
			}
		}
		t.Fatalf("/metrics has no cdcout_binlog_runway_seconds")
		return 0
	}

	r := sourceRunway(func(r runway) bool { return r.Seconds != nil }, "a finite runway")
	file := newestBinlog(t, db)
	// The checkpoint is in the newest file: its expiry starts when it is closed.
	if *r.Seconds < 3590 || *r.Seconds > 3600 || r.File != file || r.Limit != "binlog_expire_logs_seconds=3600" {
		t.Fatalf("runway %+v (%v s), want about 3600 s for %s by binlog_expire_logs_seconds=3600", r, *r.Seconds, file)
	}
	if m := metric(); m < 3590 || m > 3600 {
		t.Fatalf("cdcout_binlog_runway_seconds = %v, want about 3600", m)
	}
	untilReadyz(t, cfg.HTTPAddr, 503, "below 2h0m0s: the server may purge "+file, 10*time.Second)

	srv.Exec(t, "SET GLOBAL binlog_expire_logs_seconds = 0")
	if srv.Flavor == mysqltest.MariaDB {
		srv.Exec(t, "SET GLOBAL expire_logs_days = 0")
	}
	sourceRunway(func(r runway) bool { return r.Never && r.Seconds == nil }, "an unlimited runway")
	if m := metric(); !math.IsInf(m, 1) {
		t.Fatalf("cdcout_binlog_runway_seconds = %v, want +Inf", m)
	}
	untilReadyz(t, cfg.HTTPAddr, 200, "ready", 10*time.Second)
}

// newestBinlog is the last file SHOW BINARY LOGS lists.
func newestBinlog(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query("SHOW BINARY LOGS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var name string
	for rows.Next() {
		vals := make([]any, len(cols))
		vals[0] = &name
		for i := 1; i < len(vals); i++ {
			vals[i] = new(sql.RawBytes)
		}
		if err := rows.Scan(vals...); err != nil {
			t.Fatal(err)
		}
	}
	return name
}
