package binlog

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

func TestRunwayOf(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	closed := now.Add(-time.Hour)
	files := []binlogFile{{"b.1", 100}, {"b.2", 300}, {"b.3", 50}}
	day := retention{expire: 24 * time.Hour, expireSet: true, setting: "binlog_expire_logs_seconds=86400"}
	for _, tc := range []struct {
		name      string
		ret       retention
		file      string
		rate      float64
		wantNever bool
		want      time.Duration // PurgeAt - now
		wantLimit string
		wantBytes int64
	}{
		{name: "closed file expires a day after it was closed", ret: day, file: "b.2", want: 23 * time.Hour, wantLimit: "binlog_expire_logs_seconds"},
		{name: "the newest file is never purged before it is closed", ret: day, file: "b.3", want: 24 * time.Hour, wantLimit: "binlog_expire_logs_seconds"},
		{name: "no expiry", ret: retention{}, file: "b.2", wantNever: true, wantLimit: "none"},
		{name: "purged already", ret: day, file: "b.0", want: 0, wantLimit: "purged"},
		{name: "RDS NULL retention: due once closed", ret: retention{expireSet: true, setting: "rds binlog retention hours=NULL"}, file: "b.2", want: -time.Hour, wantLimit: "rds"},
		{name: "size limit without writes", ret: retention{maxTotal: 1000}, file: "b.2", wantNever: true, wantLimit: "too few writes", wantBytes: 650},
		{name: "size limit at 10 bytes/s", ret: retention{maxTotal: 1000}, file: "b.2", rate: 10, want: 65 * time.Second, wantLimit: "max_binlog_total_size=1000", wantBytes: 650},
		{name: "size limit sooner than expiry", ret: retention{expire: 24 * time.Hour, expireSet: true, setting: "binlog_expire_logs_seconds=86400", maxTotal: 1000}, file: "b.2", rate: 10, want: 65 * time.Second, wantLimit: "max_binlog_total_size", wantBytes: 650},
		{name: "expiry sooner than size limit", ret: retention{expire: 24 * time.Hour, expireSet: true, setting: "binlog_expire_logs_seconds=86400", maxTotal: 1 << 40}, file: "b.2", rate: 1, want: 23 * time.Hour, wantLimit: "binlog_expire_logs_seconds", wantBytes: 1<<40 - 350},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runwayOf(tc.ret, files, tc.file, closed, now, tc.rate)
			if r.Never != tc.wantNever {
				t.Fatalf("never = %v, want %v (%+v)", r.Never, tc.wantNever, r)
			}
			if !strings.Contains(r.Limit, tc.wantLimit) {
				t.Errorf("limit = %q, want it to mention %q", r.Limit, tc.wantLimit)
			}
			if r.RemainingBytes != tc.wantBytes {
				t.Errorf("remaining bytes = %d, want %d", r.RemainingBytes, tc.wantBytes)
			}
			if tc.wantNever {
				if got := r.Seconds(now); !math.IsInf(got, 1) {
					t.Errorf("seconds = %v, want +Inf", got)
				}
				return
			}
			if got := r.PurgeAt.Sub(now); got != tc.want {
				t.Errorf("purge in %s, want %s", got, tc.want)
			}
			if got, want := r.Seconds(now), max(tc.want.Seconds(), 0); got != want {
				t.Errorf("seconds = %v, want %v", got, want)
			}
		})
	}
}

func TestRunwayProbeRate(t *testing.T) {
	var p runwayProbe
	t0 := time.Unix(1000, 0)
	p.observe([]binlogFile{{"b.1", 100}, {"b.2", 100}}, "b.2", t0)
	if p.rate != 0 {
		t.Fatalf("rate after one look = %v, want 0", p.rate)
	}
	// b.1 purged, b.2 grew by 50 and b.3 appeared with 150: 200 bytes in 10 s.
	p.observe([]binlogFile{{"b.2", 150}, {"b.3", 150}}, "b.3", t0.Add(10*time.Second))
	if got, want := p.rate, 20.0; got != want {
		t.Fatalf("rate = %v, want %v", got, want)
	}
}

// TestRunwayMatchesServerPurge sets a short binlog expiry on a server of its
// own and checks the runway against what the server does: the checkpoint's
// file is still there when it is flushed just before the runway ends, and
// gone when it is flushed just after (event times have one-second
// resolution, the margins allow for it).
func TestRunwayMatchesServerPurge(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{})
	db := srv.Open(t)
	st := openStream(t, testConfig(t, srv))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if srv.Flavor == mysqltest.MySQL {
		// MySQL's default is 30 days; MariaDB's none.
		srv.Exec(t, "SET GLOBAL binlog_expire_logs_seconds = 0")
	}
	file, _, err := masterStatus(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	r, err := st.Runway(ctx, Position{File: file})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Never || !math.IsInf(r.Seconds(time.Now()), 1) {
		t.Fatalf("no expiry: runway %+v, want never (+Inf)", r)
	}

	const expire = 10
	srv.Exec(t, "SET GLOBAL binlog_expire_logs_seconds = 10")
	r, err = st.Runway(ctx, Position{File: file})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Seconds(time.Now()); r.Never || got < expire-1 || got > expire {
		t.Fatalf("newest file: runway %v s (%+v), want the expiry, %d s", got, r, expire)
	}

	srv.Exec(t, "FLUSH BINARY LOGS")
	r, err = st.Runway(ctx, Position{File: file})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.Limit, "binlog_expire_logs_seconds=10") || r.File != file {
		t.Fatalf("runway %+v, want binlog_expire_logs_seconds=10 deciding for %s", r, file)
	}
	if got := r.Seconds(time.Now()); got < expire-3 || got > expire {
		t.Fatalf("closed file: runway %v s, want just under %d s", got, expire)
	}
	has := func() bool {
		files, err := binlogFiles(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if f == file {
				return true
			}
		}
		return false
	}
	time.Sleep(time.Until(r.PurgeAt.Add(-2 * time.Second)))
	srv.Exec(t, "FLUSH BINARY LOGS")
	if !has() {
		t.Fatalf("%s purged 2 s before the runway %s ended", file, r.PurgeAt.Format(time.RFC3339))
	}
	time.Sleep(time.Until(r.PurgeAt.Add(2 * time.Second)))
	srv.Exec(t, "FLUSH BINARY LOGS")
	if has() {
		t.Fatalf("%s still there 2 s after the runway %s ended", file, r.PurgeAt.Format(time.RFC3339))
	}
	r, err = st.Runway(ctx, Position{File: file})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Seconds(time.Now()); got != 0 || !strings.HasPrefix(r.Limit, "purged") {
		t.Fatalf("after the purge: runway %v s (%+v), want 0, purged", got, r)
	}
}

// TestRunwayRDSRetention stands in for RDS with a procedure of the same
// name and result shape on a server of its own: its "binlog retention
// hours" governs, NULL meaning purged as soon as possible.
func TestRunwayRDSRetention(t *testing.T) {
	srv := mysqltest.Start(t, mysqltest.Options{})
	db := srv.Open(t)
	st := openStream(t, testConfig(t, srv))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	file, _, err := masterStatus(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	srv.Exec(t, "FLUSH BINARY LOGS")
	for _, tc := range []struct {
		value     string
		wantLimit string
		min, max  float64
	}{
		{"'24'", "rds binlog retention hours=24", 24*3600 - 60, 24 * 3600},
		{"NULL", "rds binlog retention hours=NULL", 0, 0},
	} {
		srv.Exec(t, "DROP PROCEDURE IF EXISTS mysql.rds_show_configuration",
			"CREATE PROCEDURE mysql.rds_show_configuration() SELECT 'binlog retention hours' AS name, "+tc.value+
				" AS value, 'binlog retention hours specifies the duration in hours before binary logs are automatically deleted.' AS description")
		r, err := st.Runway(ctx, Position{File: file})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Seconds(time.Now()); !strings.HasPrefix(r.Limit, tc.wantLimit) || got < tc.min || got > tc.max {
			t.Errorf("retention %s: runway %v s (%+v), want %s and %v…%v s", tc.value, got, r, tc.wantLimit, tc.min, tc.max)
		}
	}
	srv.Exec(t, "DROP PROCEDURE mysql.rds_show_configuration")
}
