package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

// ErrPositionUnavailable means the requested start or resume position is no
// longer in the server's binary logs (they were purged). It is never
// papered over by jumping to another position: changes in between would be
// lost without anyone deciding so.
var ErrPositionUnavailable = errors.New("binlog position no longer available on the server")

// FromKind says how a start position was given.
type FromKind int

// The kinds of start position.
const (
	FromNow     FromKind = iota // the server's current end of log
	FromStart                   // the oldest binlog the server still has
	FromGTID                    // an explicit GTID set
	FromFilePos                 // an explicit file:pos
)

// From is a parsed --from value.
type From struct {
	Kind FromKind
	// GTIDSet is the set's text for FromGTID; Flavor is the flavor its
	// syntax implies ("mysql": uuid:1-5, "mariadb": 0-1-42).
	GTIDSet string
	Flavor  string
	// File and Pos for FromFilePos.
	File string
	Pos  uint32
}

func (f From) String() string {
	switch f.Kind {
	case FromNow:
		return "now"
	case FromStart:
		return "start"
	case FromGTID:
		return f.GTIDSet
	default:
		return fmt.Sprintf("%s:%d", f.File, f.Pos)
	}
}

var (
	mariadbGTIDSetRe = regexp.MustCompile(`^\d+-\d+-\d+(,\s*\d+-\d+-\d+)*$`)
	uuidPrefixRe     = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}:`)
)

// ParseFrom parses a start position: "now" (also ""), "start", a GTID set in
// MariaDB ("0-1-42,1-2-7") or MySQL ("3e11fa47-…:1-42,…") form, or
// "file:pos" ("binlog.000003:1234").
func ParseFrom(s string) (From, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "", "now":
		return From{Kind: FromNow}, nil
	case "start":
		return From{Kind: FromStart}, nil
	}
	if mariadbGTIDSetRe.MatchString(s) {
		if _, err := gomysql.ParseMariadbGTIDSet(s); err != nil {
			return From{}, fmt.Errorf("--from %q: MariaDB GTID set: %w", s, err)
		}
		return From{Kind: FromGTID, GTIDSet: s, Flavor: gomysql.MariaDBFlavor}, nil
	}
	if uuidPrefixRe.MatchString(s) {
		set, err := gomysql.ParseMysqlGTIDSet(s)
		if err != nil {
			return From{}, fmt.Errorf("--from %q: MySQL GTID set: %w", s, err)
		}
		return From{Kind: FromGTID, GTIDSet: set.String(), Flavor: gomysql.MySQLFlavor}, nil
	}
	if i := strings.LastIndexByte(s, ':'); i > 0 {
		file, posStr := s[:i], s[i+1:]
		pos, err := strconv.ParseUint(posStr, 10, 32)
		if err == nil && !strings.ContainsAny(file, " ,:") {
			if pos < 4 {
				pos = 4 // the first event of every binlog file starts at 4
			}
			return From{Kind: FromFilePos, File: file, Pos: uint32(pos)}, nil
		}
	}
	return From{}, fmt.Errorf("--from %q: want now, start, a GTID set (0-1-42 or uuid:1-42) or file:pos", s)
}

// startPoint is where a sync (re)starts: a GTID set when known and chosen,
// else file:pos. gset, when non-nil, is the executed set at that point and
// is kept up to date commit by commit.
type startPoint struct {
	gset    gomysql.GTIDSet
	file    string
	pos     uint32
	useGTID bool
}

func (p startPoint) String() string {
	if p.useGTID {
		return "gtid " + p.gset.String()
	}
	return fmt.Sprintf("%s:%d", p.file, p.pos)
}

// binlogFiles lists the server's binary logs, oldest first.
func binlogFiles(ctx context.Context, db *sql.DB) ([]string, error) {
	files, err := binaryLogs(ctx, db)
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.name
	}
	return names, err
}

// masterStatus returns the current end of the binary log.
func masterStatus(ctx context.Context, db *sql.DB) (string, uint32, error) {
	var lastErr error
	// MySQL 8.4 renamed the statement; older servers and MariaDB know the
	// first spelling.
	for _, q := range []string{"SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"} {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			lastErr = err
			continue
		}
		cols, _ := rows.Columns()
		var file string
		var pos uint64
		if rows.Next() {
			vals, err := scanRaw(rows, len(cols))
			if err != nil {
				rows.Close()
				return "", 0, err
			}
			file = string(vals[0])
			pos, _ = strconv.ParseUint(string(vals[1]), 10, 32)
		}
		rows.Close()
		if file == "" {
			return "", 0, errors.New(q + " returned no row: is the binary log on?")
		}
		return file, uint32(pos), nil
	}
	return "", 0, fmt.Errorf("read current binlog position: %w", lastErr)
}

var gtidListRe = regexp.MustCompile(`\d+-\d+-\d+`)

// mariadbGTIDListAt returns the GTID list at the start of a MariaDB binlog
// file: the last GTID of every domain written before that file, that is,
// what a reader starting at the file has already "executed".
func mariadbGTIDListAt(ctx context.Context, db *sql.DB, file string) (gomysql.GTIDSet, error) {
	rows, err := db.QueryContext(ctx, "SHOW BINLOG EVENTS IN '"+strings.ReplaceAll(file, "'", "''")+"' LIMIT 4")
	if err != nil {
		return nil, fmt.Errorf("read gtid list of %s: %w", file, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	for rows.Next() {
		vals, err := scanRaw(rows, len(cols))
		if err != nil {
			return nil, err
		}
		// Log_name, Pos, Event_type, Server_id, End_log_pos, Info
		if string(vals[2]) == "Gtid_list" {
			return gomysql.ParseMariadbGTIDSet(strings.Join(gtidListRe.FindAllString(string(vals[5]), -1), ","))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return gomysql.ParseMariadbGTIDSet("")
}

// purgedError names the missing position and the operator's choices.
//
// checkpoint says the position is a resume position (Config.Resume), which
// wins over --from: the advice is then the command that discards it.
func purgedError(pos, oldest string, checkpoint bool) error {
	if checkpoint {
		return fmt.Errorf("the checkpoint position %s is no longer in the server's binary logs (oldest available: %s); "+
			"changes after it are lost to this reader, and --from alone cannot help: the checkpoint wins over it. "+
			"Decide, then discard the checkpoint with cdcout run --reset-position --from start (capture what the server still has; "+
			"the changes in between are lost) or --reset-position --from now (skip everything up to now), "+
			"and re-backfill the tables (cdcout backfill) if the lost changes matter: %w", pos, oldest, ErrPositionUnavailable)
	}
	return fmt.Errorf("start position %s is no longer in the server's binary logs (oldest available: %s); "+
		"changes after it are lost to this reader. Decide, then run with --from start or --from now explicitly "+
		"to skip them, or re-backfill the tables: %w", pos, oldest, ErrPositionUnavailable)
}

// resolveStart turns Config.Resume / Config.From into a start point and
// checks that the server still has it.
func (s *Stream) resolveStart(ctx context.Context) (startPoint, error) {
	files, err := binlogFiles(ctx, s.db)
	if err != nil {
		return startPoint{}, err
	}
	if len(files) == 0 {
		return startPoint{}, errors.New("the server lists no binary logs: is the binary log on?")
	}
	oldest := files[0]
	mariadb := s.info.Flavor == gomysql.MariaDBFlavor

	if r := s.cfg.Resume; r != nil {
		if r.Flavor != "" && r.Flavor != s.info.Flavor {
			return startPoint{}, fmt.Errorf("resume position was written by a %s server, this one is %s", r.Flavor, s.info.Flavor)
		}
		if r.GTIDSet != "" {
			return s.gtidStart(ctx, r.GTIDSet, oldest)
		}
		if r.File == "" {
			return startPoint{}, errors.New("resume position has neither a GTID set nor a file:pos")
		}
		if r.ServerUUID != "" && r.ServerUUID != s.info.ServerUUID {
			return startPoint{}, fmt.Errorf("resume position %s:%d belongs to server %s but this server is %s: "+
				"file positions mean nothing on another server; resume needs GTIDs, or choose --from explicitly",
				r.File, r.Pos, r.ServerUUID, s.info.ServerUUID)
		}
		return s.filePosStart(ctx, r.File, r.Pos, files, mariadb)
	}

	from, err := ParseFrom(s.cfg.From)
	if err != nil {
		return startPoint{}, err
	}
	switch from.Kind {
	case FromNow:
		if mariadb || s.info.GTIDMode {
			name := "gtid_executed"
			if mariadb {
				name = "gtid_binlog_pos"
			}
			set, err := globalGTIDSet(ctx, s.db, name, mariadb)
			if err != nil {
				return startPoint{}, err
			}
			return startPoint{gset: set, useGTID: true}, nil
		}
		file, pos, err := masterStatus(ctx, s.db)
		if err != nil {
			return startPoint{}, err
		}
		return startPoint{file: file, pos: pos}, nil
	case FromStart:
		// Read from the first event of the oldest file; the GTID set at
		// that point seeds the resume set.
		sp := startPoint{file: oldest, pos: 4}
		if mariadb {
			set, err := mariadbGTIDListAt(ctx, s.db, oldest)
			if err != nil {
				return startPoint{}, err
			}
			sp.gset = set
		} else if s.info.GTIDMode {
			set, err := globalGTIDSet(ctx, s.db, "gtid_purged", false)
			if err != nil {
				return startPoint{}, err
			}
			sp.gset = set
		}
		return sp, nil
	case FromGTID:
		if from.Flavor != s.info.Flavor {
			return startPoint{}, fmt.Errorf("--from %s is a %s GTID set but the server is %s", from.GTIDSet, from.Flavor, s.info.Flavor)
		}
		return s.gtidStart(ctx, from.GTIDSet, oldest)
	default:
		return s.filePosStart(ctx, from.File, from.Pos, files, mariadb)
	}
}

func (s *Stream) gtidStart(ctx context.Context, text, oldest string) (startPoint, error) {
	set, err := gomysql.ParseGTIDSet(s.info.Flavor, text)
	if err != nil {
		return startPoint{}, fmt.Errorf("parse GTID set %q: %w", text, err)
	}
	if s.info.Flavor == gomysql.MariaDBFlavor {
		// Every domain's GTID at the start of the oldest file must be
		// covered: a lower sequence number means the transactions in
		// between were purged.
		first, err := mariadbGTIDListAt(ctx, s.db, oldest)
		if err != nil {
			return startPoint{}, err
		}
		want := set.(*gomysql.MariadbGTIDSet)
		for domain, g := range first.(*gomysql.MariadbGTIDSet).Sets {
			have, ok := want.Sets[domain]
			if !ok || have.SequenceNumber < g.SequenceNumber {
				return startPoint{}, purgedError("gtid "+text, fmt.Sprintf("%s, which starts after gtid %s", oldest, first.String()), s.cfg.Resume != nil)
			}
		}
	} else {
		ps, err := globalGTIDSet(ctx, s.db, "gtid_purged", false)
		if err != nil {
			return startPoint{}, err
		}
		if !set.Contain(ps) {
			return startPoint{}, purgedError("gtid "+text, "gtid_purged "+ps.String(), s.cfg.Resume != nil)
		}
	}
	return startPoint{gset: set, useGTID: true}, nil
}

// globalGTIDSet reads and parses the GTID set in a global variable:
// gtid_executed or gtid_purged, or MariaDB's gtid_binlog_pos.
func globalGTIDSet(ctx context.Context, db *sql.DB, name string, mariadb bool) (gomysql.GTIDSet, error) {
	var gs string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL."+name).Scan(&gs); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	var (
		set gomysql.GTIDSet
		err error
	)
	if mariadb {
		set, err = gomysql.ParseMariadbGTIDSet(gs)
	} else {
		// MySQL wraps a long set over lines.
		set, err = gomysql.ParseMysqlGTIDSet(strings.ReplaceAll(gs, "\n", ""))
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s %q: %w", name, gs, err)
	}
	return set, nil
}

func (s *Stream) filePosStart(ctx context.Context, file string, pos uint32, files []string, mariadb bool) (startPoint, error) {
	found := false
	for _, f := range files {
		if f == file {
			found = true
			break
		}
	}
	if !found {
		if gomysql.CompareBinlogFileName(file, files[0]) < 0 {
			return startPoint{}, purgedError(fmt.Sprintf("%s:%d", file, pos), files[0], s.cfg.Resume != nil)
		}
		return startPoint{}, fmt.Errorf("binlog file %s is not on the server (it has %s … %s)", file, files[0], files[len(files)-1])
	}
	sp := startPoint{file: file, pos: pos}
	if mariadb {
		// MariaDB can name the GTID state at any file:pos, so the stream
		// tracks GTIDs (and resumes by them) from here on.
		var gs sql.NullString
		if err := s.db.QueryRowContext(ctx, "SELECT BINLOG_GTID_POS(?, ?)", file, pos).Scan(&gs); err == nil && gs.Valid {
			if set, err := gomysql.ParseMariadbGTIDSet(gs.String); err == nil {
				sp.gset = set
			}
		}
	}
	return sp, nil
}

// positionOf converts the tracked state to the exported Position.
func (s *Stream) positionOf(gset gomysql.GTIDSet, file string, pos uint32) Position {
	p := Position{Flavor: s.info.Flavor, ServerUUID: s.info.ServerUUID, File: file, Pos: pos}
	if gset != nil {
		p.GTIDSet = gset.String()
	}
	return p
}

// isFatalReadError recognises the server refusing to send the binlog
// (ER_MASTER_FATAL_ERROR_READING_BINLOG): retrying cannot fix it.
func isFatalReadError(err error) bool {
	var me *gomysql.MyError
	if errors.As(err, &me) && me.Code == gomysql.ER_MASTER_FATAL_ERROR_READING_BINLOG {
		return true
	}
	return strings.Contains(err.Error(), "ERROR 1236")
}

// isPurgedError recognises the fatal read errors that mean the binlog the
// position needs is gone.
func isPurgedError(err error) bool {
	msg := err.Error()
	for _, s := range []string{"Could not find first log file", "Could not find GTID state",
		"purged binary logs", "purged required binary logs", "could not find next log", "Could not open log file"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// GTIDs parses the position's GTID set in its flavor; nil when the
// position has none.
func (p Position) GTIDs() (gomysql.GTIDSet, error) {
	if p.GTIDSet == "" {
		return nil, nil
	}
	flavor := p.Flavor
	if flavor == "" {
		flavor = gomysql.MySQLFlavor
		if mariadbGTIDSetRe.MatchString(p.GTIDSet) {
			flavor = gomysql.MariaDBFlavor
		}
	}
	set, err := gomysql.ParseGTIDSet(flavor, p.GTIDSet)
	if err != nil {
		return nil, fmt.Errorf("parse gtid set %q: %w", p.GTIDSet, err)
	}
	return set, nil
}

// FilePos is the position's file:pos in go-mysql's form.
func (p Position) FilePos() gomysql.Position {
	return gomysql.Position{Name: p.File, Pos: p.Pos}
}

// String is the position for humans and logs: the GTID set when there is
// one, else server_uuid/file:pos.
func (p Position) String() string {
	if p.GTIDSet != "" {
		return p.GTIDSet
	}
	if p.File == "" {
		return "(none)"
	}
	if p.ServerUUID != "" {
		return fmt.Sprintf("%s/%s:%d", p.ServerUUID, p.File, p.Pos)
	}
	return fmt.Sprintf("%s:%d", p.File, p.Pos)
}

// Covers reports whether position a is at or after position b, i.e.
// every transaction up to b is included in a: a's GTID set contains b's,
// or, both file:pos of one server, a is not before b. Unknown or
// incomparable positions give false.
func (a Position) Covers(b Position) bool {
	if a.GTIDSet != "" && b.GTIDSet != "" {
		ga, err := a.GTIDs()
		if err != nil || ga == nil {
			return false
		}
		gb, err := b.GTIDs()
		if err != nil || gb == nil {
			return false
		}
		return ga.Contain(gb)
	}
	if a.GTIDSet != "" || b.GTIDSet != "" || a.File == "" || b.File == "" || a.ServerUUID != b.ServerUUID {
		return false
	}
	if c := compareFiles(a.File, b.File); c != 0 {
		return c > 0
	}
	return a.Pos >= b.Pos
}

// compareFiles orders binlog file names (base.000012): same base, then by
// the numeric suffix's length and text.
func compareFiles(a, b string) int {
	ai, bi := strings.LastIndexByte(a, '.'), strings.LastIndexByte(b, '.')
	if ai < 0 || bi < 0 || a[:ai] != b[:bi] {
		return strings.Compare(a, b)
	}
	as, bs := a[ai+1:], b[bi+1:]
	if len(as) != len(bs) {
		if len(as) < len(bs) {
			return -1
		}
		return 1
	}
	return strings.Compare(as, bs)
}

// scanRaw scans the current row into n raw columns: SHOW statements'
// columns differ by flavour and version, so they are read by position.
func scanRaw(rows *sql.Rows, n int) ([]sql.RawBytes, error) {
	vals := make([]sql.RawBytes, n)
	ptrs := make([]any, n)
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	return vals, rows.Scan(ptrs...)
}
