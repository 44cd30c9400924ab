package binlog

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/internal/gctune"
	"github.com/cdcout/cdcout/internal/pause"
)

// Defaults for Config.HeartbeatPeriod and Config.ReadTimeout. The server
// sends a heartbeat after a second without events, so a link that carries
// nothing for silentAfter heartbeat periods is reported down (Health) at
// once, and closed and reconnected after ReadTimeout. A heartbeat is a few
// dozen bytes; a minute's detection, as with 5 s and 30 s, let readiness
// lie for that long (issue 14).
const (
	defaultHeartbeatPeriod = time.Second
	DefaultReadTimeout     = 10 * time.Second
)

// silentAfter is how many heartbeat periods without any event or
// heartbeat make Health report the connection down.
const silentAfter = 3

// emptyCommitEvery bounds how often a transaction that carried no emitted
// row still produces a Commit. Such commits only let the checkpoint move
// past traffic on tables nobody captures; one a second is plenty, and
// coalescing keeps a busy uncaptured table from costing a checkpoint write
// per transaction. A coalesced commit is not lost: the next emitted Commit
// (or a heartbeat) carries a position at or past it.
const emptyCommitEvery = time.Second

// Reconnect backoff: a dropped connection, a read timeout (half-open
// connection) or a server restart is retried with these delays.
const (
	backoffMin = 200 * time.Millisecond
	backoffMax = 10 * time.Second
)

// Stream reads one server's binary log. Open checks the server and fixes
// the start position; Run streams. A Stream is used by one Run at a time;
// Position and Info may be called concurrently.
type Stream struct {
	cfg    Config
	log    *zap.Logger
	db     *sql.DB
	addr   string // user@host:port, never the password
	dsn    *mysql.Config
	info   Info
	filter *tableFilter
	schema *schemaCache
	start  startPoint
	// plaintext: tls=preferred and the server offered no TLS.
	plaintext bool
	// runway is what Runway remembers between calls (runway.go).
	runwayMu sync.Mutex
	runway   runwayProbe

	// marked caches, per database, whether it holds cdcout's marker
	// table (marker.go). Used by the reader only.
	marked map[string]bool
	// contact is the unix ns of the last event or heartbeat read, or of
	// the last connect; closing owns the syncers being closed in the
	// background (Close waits for them).
	contact atomic.Int64
	closing sync.WaitGroup

	mu      sync.Mutex
	up      bool     // a session is connected
	lastErr string   // why the last session ended
	emitted Position // last Commit handed to the handler
	// read is emitted, or a later commit of transactions that carried no
	// emitted row (coalesced, see emptyCommitEvery).
	read Position
	// prepared XA transactions held (xa.go) and since when the oldest is
	xaHeld  int
	xaSince time.Time
}

// Open connects, runs the start-up checks and resolves the start position.
// Errors name what to change; they never contain the password.
func Open(ctx context.Context, cfg Config) (*Stream, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.HeartbeatPeriod <= 0 {
		cfg.HeartbeatPeriod = defaultHeartbeatPeriod
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.ReadTimeout <= cfg.HeartbeatPeriod {
		return nil, fmt.Errorf("read timeout %s must exceed the heartbeat period %s", cfg.ReadTimeout, cfg.HeartbeatPeriod)
	}
	dsn, err := ParseDSN(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	filter, err := newTableFilter(cfg.Include, cfg.ExcludeDBs)
	if err != nil {
		return nil, err
	}
	s := &Stream{
		cfg:    cfg,
		log:    cfg.Logger.Named("binlog"),
		dsn:    dsn,
		addr:   dsn.User + "@" + dsn.Addr,
		filter: filter,
	}
	conn, err := mysql.NewConnector(dsn.Clone())
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", s.addr, err)
	}
	s.db = sql.OpenDB(conn)
	s.db.SetMaxOpenConns(4)
	ok := false
	defer func() {
		if !ok {
			s.db.Close()
		}
	}()
	if err := s.db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("connect to %s: %w", s.addr, err)
	}
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	collations, err := loadCollations(ctx, s.db)
	if err != nil {
		return nil, err
	}
	s.schema = newSchemaCache(s.db, s.log, s.info.Flavor == gomysql.MariaDBFlavor, s.info.MetadataMode == "binlog", collations)
	if dsn.TLS != nil && dsn.AllowFallbackToPlaintext {
		// tls=preferred: the replication connection follows what the SQL
		// connection negotiated, since go-mysql cannot fall back itself.
		var name, cipher string
		if err := s.db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil || cipher == "" {
			s.plaintext = true
		}
	}
	if s.start, err = s.resolveStart(ctx); err != nil {
		return nil, err
	}
	s.emitted = s.positionOf(s.start.gset, s.start.file, s.start.pos)
	s.log.Info("binlog source ready",
		zap.String("server", s.addr), zap.String("flavor", s.info.Flavor), zap.String("version", s.info.Version),
		zap.Uint32("server_id", s.info.ServerID), zap.Bool("gtid_mode", s.info.GTIDMode),
		zap.String("metadata mode", s.info.MetadataMode), zap.String("start", s.start.String()))
	if s.info.MetadataMode != "binlog" {
		s.log.Warn("column names come from information_schema (binlog_row_metadata is not FULL or the fallback is forced): " +
			"a row written before a DDL the reader has not reached yet is refused when its column count or types differ, " +
			"and cannot be told apart when they do not (a renamed column); set binlog_row_metadata=FULL")
	}
	ok = true
	return s, nil
}

// ReadPosition is the position after the last transaction read: the last
// Commit emitted, or a later one coalesced because its transactions carried
// no emitted row. A read-only backfill's fences compare it with the
// server's positions (backfill/readonly.go): it moves past uncaptured
// traffic (cdcout's own state writes, other tables) at once, where
// Position moves only every emptyCommitEvery.
func (s *Stream) ReadPosition() Position {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.read.File == "" && s.read.GTIDSet == "" {
		return s.emitted
	}
	return s.read
}

// Info describes the server.
func (s *Stream) Info() Info { return s.info }

// Position is the position of the last Commit emitted (before any, the
// start position).
func (s *Stream) Position() Position {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.emitted
}

// PreparedXA reports how many XA transactions are prepared and held,
// waiting for their XA COMMIT or ROLLBACK, and since when the oldest is.
// While any is, the checkpoint cannot pass it.
func (s *Stream) PreparedXA() (n int, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.xaHeld, s.xaSince
}

// Health is the state of the binlog connection, for readiness and metrics.
type Health struct {
	// Connected: a session is up and the server spoke within the last
	// few heartbeat periods.
	Connected bool
	// LastContact is when the last event or heartbeat was read (or the
	// connection made); zero before the first connect.
	LastContact time.Time
	// Error says why the stream is not connected ("" when it is).
	Error string
}

// Health reports the binlog connection's real state: a session that has
// heard nothing, not even a heartbeat, for silentAfter heartbeat periods
// counts as down even before its read timeout closes it.
func (s *Stream) Health() Health {
	s.mu.Lock()
	up, lastErr := s.up, s.lastErr
	s.mu.Unlock()
	h := Health{}
	if ns := s.contact.Load(); ns != 0 {
		h.LastContact = time.Unix(0, ns)
	}
	silent := time.Since(h.LastContact)
	switch {
	case !up && lastErr != "":
		h.Error = lastErr
	case !up:
		h.Error = "not connected"
	case silent > silentAfter*s.cfg.HeartbeatPeriod:
		h.Error = fmt.Sprintf("no event or heartbeat from the server for %s (heartbeat period %s)", silent.Round(100*time.Millisecond), s.cfg.HeartbeatPeriod)
	default:
		h.Connected = true
	}
	return h
}

func (s *Stream) touch() { s.contact.Store(time.Now().UnixNano()) }

func (s *Stream) setUp(up bool, err error) {
	s.mu.Lock()
	s.up = up
	if err != nil {
		s.lastErr = err.Error()
	} else if up {
		s.lastErr = ""
	}
	s.mu.Unlock()
}

// Close releases the database connections, after the syncers of ended
// sessions have closed. Run must have returned.
func (s *Stream) Close() error {
	s.closing.Wait()
	return s.db.Close()
}

// maxDeferredBytes bounds the undecoded rows events (deferredRows) one
// transaction may hold; past it they are counted at once. cdcout's own
// enqueue transactions (outbox rows with their payloads, claims) are
// uncaptured and typically 1–3 MB: at 1 MiB, decoding them only to count
// them cost 3 % of the engine's CPU in the end-to-end benchmark.
const maxDeferredBytes = 8 << 20

// deferredRows stands in, as the only value of a RowsEvent's Rows, for the
// rows of a table the stream does not capture (cdcout's own state
// database, above all, which shares the binlog): decoding row images is
// most of what parsing a rows event costs, and these rows are never
// emitted. Their number still matters, because row ordinals count every
// row image of a transaction before filtering, but only to a captured row
// that follows them in the same transaction; the reader decodes them then
// (reader.countDeferred) and drops them unread at the commit otherwise.
type deferredRows struct {
	data []byte // the event body, copied: the parser reuses its buffer
	pos  int    // where the row images start in data
}

// decodeRowsEvent is go-mysql's RowsEventDecodeFunc. It runs on the
// syncer's goroutine, ahead of the reader; the table filter is read-only.
func (s *Stream) decodeRowsEvent(e *replication.RowsEvent, data []byte) error {
	pos, err := e.DecodeHeader(data)
	if err != nil {
		return err
	}
	if len(data) >= wideEventBytes {
		gctune.Wide(len(data))
	}
	if !s.filter.match(string(e.Table.Schema), string(e.Table.Table)) {
		if len(data) >= wideEventBytes {
			// Counted at once (the reader only reads len(e.Rows)): a copy
			// of one wide event, typically our own write of a wide record,
			// would hold its size once more until the commit, while
			// decoding a few wide rows costs little.
			if err := e.DecodeData(pos, data); err != nil {
				return err
			}
			e.Rows = make([][]any, len(e.Rows))
			return nil
		}
		e.Rows = [][]any{{deferredRows{data: bytes.Clone(data), pos: pos}}}
		return nil
	}
	if e.Type() == replication.EnumRowsEventTypeUnknown {
		// A PARTIAL_UPDATE_ROWS_EVENT, decoded under its own table map.
		if jsonCols := jsonColumns(e.Table); len(jsonCols) > 0 {
			return decodePartialJSONRows(e, data, pos, jsonCols)
		}
		return e.DecodeData(pos, data)
	}
	orig := e.Table
	tm, fix := decodeTableMap(orig)
	e.Table = tm
	err = e.DecodeData(pos, data)
	e.Table = orig
	if err != nil {
		return err
	}
	fix.apply(e.Rows)
	return nil
}

// wideEventBytes is the rows event size from which the garbage collector
// is told a wide row is passing (gctune.Wide).
const wideEventBytes = 1 << 20

// deferredOf returns the deferredRows standing in for e's rows.
func deferredOf(e *replication.RowsEvent) (deferredRows, bool) {
	if len(e.Rows) != 1 || len(e.Rows[0]) != 1 {
		return deferredRows{}, false
	}
	d, ok := e.Rows[0][0].(deferredRows)
	return d, ok
}

// Run streams until ctx ends (returning ctx.Err()) or h fails (returning
// h's error as is). Every Change precedes its transaction's Commit.
//
// On a dropped connection, read timeout or server restart Run reconnects
// with backoff and resumes at the last committed transaction. Rows of a
// transaction that was cut off are emitted again from its first row, with
// the same ordinals and (in GTID mode) the same change keys: downstream
// deduplicates by change key, so a replay is harmless while a gap would
// not be.
func (s *Stream) Run(ctx context.Context, h func(context.Context, Event) error) error {
	scfg, err := s.syncerConfig()
	if err != nil {
		return err
	}
	r := &reader{s: s, h: h, resume: s.start, lastCommit: time.Now()}
	if r.resume.gset != nil {
		r.resume.gset = r.resume.gset.Clone()
	}
	backoff := backoffMin
	for {
		commits := r.commits
		err := r.session(ctx, scfg)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var he *handlerError
		if errors.As(err, &he) {
			return he.err
		}
		var pe *permanentError
		if errors.As(err, &pe) {
			return pe.err
		}
		if r.commits > commits {
			// The last connection did useful work: this is a new failure,
			// not the same one again.
			backoff = backoffMin
		}
		// err.Error(): go-mysql's errors carry stack traces zap would print.
		s.log.Warn("binlog connection lost; resuming at the last commit",
			zap.String("error", err.Error()), zap.String("resume", r.resume.String()), zap.Duration("backoff", backoff))
		if err := pause.For(ctx, backoff); err != nil {
			return err
		}
		backoff = min(backoff*2, backoffMax)
	}
}
