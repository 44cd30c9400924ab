package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"

	"github.com/cdcout/cdcout/state"
)

// Runway is how long the server keeps the binlog file a checkpoint is in:
// past PurgeAt the server may delete it, and a replica resuming from that
// checkpoint then stops (ErrPositionUnavailable). It is the earliest time
// the server's settings allow; servers purge only when they rotate a file
// (or on FLUSH/PURGE), so the file may live a little longer.
type Runway struct {
	// File is the binlog file holding the checkpoint.
	File string `json:"file"`
	// Never: no setting of the server purges binlogs (expiry 0, automatic
	// purge off, no size limit or no writes to reach it).
	Never bool `json:"never"`
	// PurgeAt is the earliest time File may be purged (zero when Never).
	PurgeAt time.Time `json:"purgeAt,omitzero"`
	// Limit names the setting that decides PurgeAt, with its value
	// ("binlog_expire_logs_seconds=2592000", "max_binlog_total_size=…").
	Limit string `json:"limit"`
	// RemainingBytes is what may still be written before a size limit
	// (max_binlog_total_size) purges File; 0 without one.
	RemainingBytes int64 `json:"remainingBytes,omitempty"`
	// Warning is a setting that could not be read (RDS's configuration
	// procedure without the grant to call it).
	Warning string `json:"warning,omitempty"`
	// CheckedAt is when the server's settings and binlog list were read.
	CheckedAt time.Time `json:"checkedAt"`
}

// Seconds is the runway left at now: +Inf when the file is never purged,
// 0 once it is due.
func (r Runway) Seconds(now time.Time) float64 {
	if r.Never {
		return math.Inf(1)
	}
	return max(r.PurgeAt.Sub(now).Seconds(), 0)
}

// retention is what the server purges binlogs by.
type retention struct {
	// expire is the time-based expiry; 0 with expireSet false means none.
	expire    time.Duration
	expireSet bool
	setting   string // the variable expire comes from, with its value
	// maxTotal is MariaDB's max_binlog_total_size (11.4+); 0 for none.
	maxTotal int64
	warning  string
}

// binlogFile is one row of SHOW BINARY LOGS.
type binlogFile struct {
	name string
	size int64
}

// readRetention reads the purge settings: binlog_expire_logs_seconds
// (MySQL 8, MariaDB 10.6+), expire_logs_days where that is all there is
// or the seconds are 0 (MySQL 8.0 honours the days then),
// binlog_expire_logs_auto_purge (MySQL 8.0.29+; OFF purges nothing
// automatically), max_binlog_total_size (MariaDB 11.4+), and on RDS and
// Aurora the "binlog retention hours" of mysql.rds_show_configuration,
// which governs there.
func readRetention(ctx context.Context, db *sql.DB) (retention, error) {
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL VARIABLES WHERE Variable_name IN "+
		"('binlog_expire_logs_seconds','expire_logs_days','binlog_expire_logs_auto_purge','max_binlog_total_size')")
	if err != nil {
		return retention{}, fmt.Errorf("read binlog expiry settings: %w", err)
	}
	v := map[string]string{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			rows.Close()
			return retention{}, fmt.Errorf("read binlog expiry settings: %w", err)
		}
		v[strings.ToLower(name)] = value
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return retention{}, fmt.Errorf("read binlog expiry settings: %w", err)
	}
	var r retention
	if secs, _ := strconv.ParseInt(v["binlog_expire_logs_seconds"], 10, 64); secs > 0 {
		r.expire, r.expireSet, r.setting = time.Duration(secs)*time.Second, true, "binlog_expire_logs_seconds="+v["binlog_expire_logs_seconds"]
	} else if days, _ := strconv.ParseFloat(v["expire_logs_days"], 64); days > 0 {
		r.expire, r.expireSet, r.setting = time.Duration(days*86400)*time.Second, true, "expire_logs_days="+v["expire_logs_days"]
	}
	if strings.EqualFold(v["binlog_expire_logs_auto_purge"], "OFF") {
		r.expire, r.expireSet, r.setting = 0, false, "binlog_expire_logs_auto_purge=OFF"
	}
	r.maxTotal, _ = strconv.ParseInt(v["max_binlog_total_size"], 10, 64)
	hours, found, err := rdsRetentionHours(ctx, db)
	switch {
	case err != nil:
		r.warning = err.Error()
	case found && !hours.Valid:
		// RDS purges a binlog as soon as nothing needs it.
		r.expire, r.expireSet, r.setting = 0, true, "rds binlog retention hours=NULL (set it: CALL mysql.rds_set_configuration('binlog retention hours', 24))"
	case found:
		r.expire, r.expireSet, r.setting = time.Duration(hours.Int64)*time.Hour, true, "rds binlog retention hours="+strconv.FormatInt(hours.Int64, 10)
	}
	return r, nil
}

// rdsRetentionHours calls mysql.rds_show_configuration, which exists on
// RDS and Aurora only; found is false where it does not exist.
func rdsRetentionHours(ctx context.Context, db *sql.DB) (hours sql.NullInt64, found bool, err error) {
	rows, err := db.QueryContext(ctx, "CALL mysql.rds_show_configuration")
	if err != nil {
		if state.Errno(err) == state.ErrnoSPDoesNotExist {
			return hours, false, nil
		}
		return hours, false, fmt.Errorf("read RDS binlog retention (CALL mysql.rds_show_configuration): %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return hours, false, err
	}
	for rows.Next() {
		vals, err := scanRaw(rows, len(cols))
		if err != nil {
			return hours, false, err
		}
		// name, value, description
		if len(vals) >= 2 && strings.EqualFold(string(vals[0]), "binlog retention hours") {
			found = true
			if v := string(vals[1]); vals[1] != nil && v != "" && !strings.EqualFold(v, "NULL") {
				n, perr := strconv.ParseInt(v, 10, 64)
				if perr != nil {
					return hours, false, fmt.Errorf("RDS binlog retention hours %q: %w", v, perr)
				}
				hours = sql.NullInt64{Int64: n, Valid: true}
			}
		}
	}
	for rows.NextResultSet() {
	}
	return hours, found, rows.Err()
}

// binaryLogs is SHOW BINARY LOGS, oldest first, with the file sizes.
func binaryLogs(ctx context.Context, db *sql.DB) ([]binlogFile, error) {
	rows, err := db.QueryContext(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return nil, fmt.Errorf("show binary logs: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	var files []binlogFile
	for rows.Next() {
		vals, err := scanRaw(rows, len(cols))
		if err != nil {
			return nil, err
		}
		f := binlogFile{name: string(vals[0])}
		if len(vals) > 1 {
			f.size, _ = strconv.ParseInt(string(vals[1]), 10, 64)
		}
		files = append(files, f)
	}
	return files, rows.Err()
}

// runwayOf is the arithmetic of the server's purge, given its settings,
// its binlog files, the checkpoint's file, closedAt (when that file was
// closed: the start of the next one; zero while it is the newest, which
// is never purged) and the rate binlogs grow at (bytes/s, 0 when unknown).
//
// A file is purged by time once it was last written (closed) longer ago
// than the expiry; by size when the files from it to the newest exceed
// max_binlog_total_size, the oldest going first.
func runwayOf(r retention, files []binlogFile, file string, closedAt, now time.Time, rate float64) Runway {
	out := Runway{File: file, CheckedAt: now, Never: true, Limit: "none (binlogs never expire)", Warning: r.warning}
	at := -1
	for i, f := range files {
		if f.name == file {
			at = i
		}
	}
	if at < 0 {
		return Runway{File: file, CheckedAt: now, PurgeAt: now, Limit: "purged (the server no longer has the file)", Warning: r.warning}
	}
	if r.expireSet {
		base := closedAt
		if at == len(files)-1 || base.IsZero() {
			base = now // the newest file: its expiry starts when it is closed
		}
		out.Never, out.PurgeAt, out.Limit = false, base.Add(r.expire), r.setting
	}
	if r.maxTotal > 0 {
		var held int64
		for _, f := range files[at:] {
			held += f.size
		}
		out.RemainingBytes = max(r.maxTotal-held, 0)
		// Beyond a century (and beyond time.Duration) a size limit decides nothing.
		if secs := float64(out.RemainingBytes) / max(rate, 0); rate > 0 && secs < 100*365*86400 {
			bySize := now.Add(time.Duration(secs * float64(time.Second)))
			if out.Never || bySize.Before(out.PurgeAt) {
				out.Never, out.PurgeAt = false, bySize
				out.Limit = fmt.Sprintf("max_binlog_total_size=%d at %.0f bytes/s", r.maxTotal, rate)
			}
		} else if out.Never {
			out.Limit = fmt.Sprintf("max_binlog_total_size=%d (too few writes seen to estimate when)", r.maxTotal)
		}
	}
	return out
}

// runwayProbe keeps what the runway reads learn between calls: the start
// time of each binlog file (it never changes) and the last binlog size,
// for the write rate.
type runwayProbe struct {
	starts   map[string]time.Time
	lastAt   time.Time
	lastFile string
	lastHeld int64
	rate     float64
}

// runwayServerID is the replication id of the short connection that reads
// a binlog file's first event: distinct from the stream's id (id) and a
// standby's (bit 31), so it never displaces either.
func runwayServerID(id uint32) uint32 { return id ^ 1<<30 }

// Runway reads how long the server keeps the binlog file holding
// checkpoint (see Runway). It needs the time that file was closed, which
// only the first event of the next file tells remotely; it is read once
// per file over a replication connection of its own (runwayServerID).
func (s *Stream) Runway(ctx context.Context, checkpoint Position) (Runway, error) {
	if checkpoint.File == "" {
		return Runway{}, errors.New("binlog runway: the checkpoint has no file")
	}
	ret, err := readRetention(ctx, s.db)
	if err != nil {
		return Runway{}, err
	}
	files, err := binaryLogs(ctx, s.db)
	if err != nil {
		return Runway{}, err
	}
	now := time.Now()
	s.runwayMu.Lock()
	defer s.runwayMu.Unlock()
	p := &s.runway
	var closedAt time.Time
	for i, f := range files {
		if f.name != checkpoint.File || i == len(files)-1 {
			continue
		}
		next := files[i+1].name
		if t, ok := p.starts[next]; ok {
			closedAt = t
			break
		}
		t, err := s.fileStart(ctx, next)
		if err != nil {
			return Runway{}, fmt.Errorf("binlog runway: read when %s started: %w", next, err)
		}
		if p.starts == nil {
			p.starts = map[string]time.Time{}
		}
		p.starts[next], closedAt = t, t
	}
	p.observe(files, checkpoint.File, now)
	return runwayOf(ret, files, checkpoint.File, closedAt, now, p.rate), nil
}

// observe updates the binlog write rate: the growth of the files from the
// previous checkpoint file on (purges never take those while it is held).
func (p *runwayProbe) observe(files []binlogFile, file string, now time.Time) {
	held := func(from string) (n int64) {
		for _, f := range files {
			if f.name >= from {
				n += f.size
			}
		}
		return n
	}
	if p.lastFile != "" {
		if dt := now.Sub(p.lastAt).Seconds(); dt > 0 {
			if grown := held(p.lastFile) - p.lastHeld; grown >= 0 {
				p.rate = float64(grown) / dt
			}
		}
	}
	p.lastAt, p.lastFile, p.lastHeld = now, file, held(file)
}

// fileStart reads the timestamp of a binlog file's format description
// event: when the server created it, that is when it closed the file
// before it.
func (s *Stream) fileStart(ctx context.Context, file string) (time.Time, error) {
	cfg, err := s.syncerConfig()
	if err != nil {
		return time.Time{}, err
	}
	cfg.ServerID = runwayServerID(s.cfg.ServerID)
	cfg.RowsEventDecodeFunc = nil
	cfg.EventCacheCount = 4
	syncer := replication.NewBinlogSyncer(cfg)
	defer syncer.Close()
	st, err := syncer.StartSync(gomysql.Position{Name: file, Pos: 4})
	if err != nil {
		return time.Time{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		ev, err := st.GetEvent(ctx)
		if err != nil {
			return time.Time{}, err
		}
		// The server's artificial rotate event comes first, stamped 0.
		if ev.Header.EventType == replication.FORMAT_DESCRIPTION_EVENT && ev.Header.Timestamp != 0 {
			return time.Unix(int64(ev.Header.Timestamp), 0), nil
		}
	}
}
