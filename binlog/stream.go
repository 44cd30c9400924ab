package binlog

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/gctune"
)

// Defaults for Config.HeartbeatPeriod and Config.ReadTimeout. The server
// sends a heartbeat after a second without events, so a link that carries
// nothing for silentAfter heartbeat periods is reported down (Health) at
// once, and closed and reconnected after ReadTimeout. A heartbeat is a few
// dozen bytes; a minute's detection, as with 5 s and 30 s, let readiness
// lie for that long (issue 14).
const (
	DefaultHeartbeatPeriod = time.Second
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
		cfg.HeartbeatPeriod = DefaultHeartbeatPeriod
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

func (s *Stream) syncerConfig() (replication.BinlogSyncerConfig, error) {
	host, portStr, err := net.SplitHostPort(s.dsn.Addr)
	var port uint64
	if err == nil {
		port, err = strconv.ParseUint(portStr, 10, 16)
	}
	if s.dsn.Net == "unix" {
		host, port, err = s.dsn.Addr, 0, nil
	}
	if err != nil {
		return replication.BinlogSyncerConfig{}, fmt.Errorf("address %q: %w", s.dsn.Addr, err)
	}
	tlsConfig := s.dsn.TLS
	if s.plaintext {
		tlsConfig = nil
	}
	return replication.BinlogSyncerConfig{
		ServerID:                s.cfg.ServerID,
		Flavor:                  s.info.Flavor,
		Host:                    host,
		Port:                    uint16(port),
		User:                    s.dsn.User,
		Password:                s.dsn.Passwd,
		TLSConfig:               tlsConfig,
		ParseTime:               false,
		UseDecimal:              false,
		TimestampStringLocation: time.UTC,
		HeartbeatPeriod:         s.cfg.HeartbeatPeriod,
		ReadTimeout:             s.cfg.ReadTimeout,
		// Reconnects are ours: go-mysql's resume point may be inside a
		// transaction, ours is always the last commit.
		DisableRetrySync: true,
		DiscardGTIDSet:   true,
		// go-mysql buffers this many decoded events ahead of the reader;
		// its default (10,240) costs ~160 MB inside a huge transaction's
		// large row events. A small queue keeps memory bounded (DESIGN.md
		// invariant 6) and costs no throughput: the reader is the
		// bottleneck either way.
		EventCacheCount:     128,
		Logger:              goMySQLLogger(s.log.Named("go-mysql")),
		RowsEventDecodeFunc: s.decodeRowsEvent,
	}, nil
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
	if jsonCols := jsonColumns(e.Table); len(jsonCols) > 0 {
		return decodeJSONRows(e, data, pos, jsonCols)
	}
	return e.DecodeData(pos, data)
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

// handlerError marks the handler's own error so Run returns it unchanged.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }

// permanentError is an error no reconnect can fix (schema, purged binlog).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

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
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, backoffMax)
	}
}

// reader is the state of one Run.
type reader struct {
	s      *Stream
	h      func(context.Context, Event) error
	resume startPoint // last committed position read (emitted or coalesced)

	file string // current binlog file
	tx   txState
	vals []any // scratch of rows: one decoded image

	lastCommit time.Time // when the last Commit was emitted
	pending    *Commit   // coalesced empty commit not yet emitted
	commits    int       // transactions read, over all connections
	xa         []heldXA  // prepared XA transactions, oldest first (xa.go)
}

// txState is the transaction being read.
type txState struct {
	gtid     string
	inBegin  bool // a BEGIN was seen: the transaction ends at XID/COMMIT
	ordinal  int  // row images so far, counted before filtering
	emitted  int  // row changes emitted
	maria    *gomysql.MariadbGTID
	mysqlSID uuid.UUID
	mysqlTag gomysql.Tag
	mysqlGNO int64
	hasMySQL bool
	tagged   bool
	// deferred are rows events of uncaptured tables not decoded yet
	// (deferredRows), deferredBytes their size.
	deferred      []deferredEvent
	deferredBytes int
	// An XA transaction (xa.go): its changes are held, not emitted.
	xa       bool
	xid      string
	held     []*canonical.Change
	xaBefore Position
}

type deferredEvent struct {
	e    *replication.RowsEvent
	step int // row images per change: 2 for updates
}

// session runs one connection until it fails.
func (r *reader) session(ctx context.Context, scfg replication.BinlogSyncerConfig) (err error) {
	syncer := replication.NewBinlogSyncer(scfg)
	defer func() {
		r.s.setUp(false, err)
		// Closing kills the server's dump thread over a new connection,
		// which on a dead link blocks for a read timeout: it must not
		// delay the reconnect.
		r.s.closing.Add(1)
		go func() {
			defer r.s.closing.Done()
			syncer.Close()
		}()
	}()
	var streamer *replication.BinlogStreamer
	sp := r.resume
	if sp.gset != nil && (sp.useGTID || sp.file == "") {
		streamer, err = syncer.StartSyncGTID(sp.gset.Clone())
	} else {
		streamer, err = syncer.StartSync(gomysql.Position{Name: sp.file, Pos: sp.pos})
	}
	if err != nil {
		return r.classify(err)
	}
	r.file = sp.file
	r.tx = txState{}
	r.s.touch()
	r.s.setUp(true, nil)
	for {
		ev, err := streamer.GetEvent(ctx)
		if err != nil {
			return r.classify(err)
		}
		r.s.touch()
		if err := r.event(ctx, ev, ev.Header); err != nil {
			return err
		}
	}
}

// classify turns server-side refusals into permanent errors.
func (r *reader) classify(err error) error {
	if err == nil {
		return err
	}
	if isFatalReadError(err) {
		if isPurgedError(err) {
			return &permanentError{purgedError(r.resume.String(), "see SHOW BINARY LOGS", r.s.cfg.Resume != nil)}
		}
		return &permanentError{fmt.Errorf("server refused to send the binlog from %s: %w", r.resume.String(), err)}
	}
	return err
}

func (r *reader) event(ctx context.Context, ev *replication.BinlogEvent, outer *replication.EventHeader) error {
	switch e := ev.Event.(type) {
	case *replication.RotateEvent:
		r.file = string(e.NextLogName)
	case *replication.MariadbGTIDEvent:
		g := e.GTID
		// A group without FL_STANDALONE ends with a COMMIT or XID even
		// when no BEGIN opens it: CREATE TABLE … SELECT logs its CREATE,
		// then its rows, then COMMIT, all under this one GTID.
		r.tx = txState{gtid: g.String(), maria: &g, inBegin: e.Flags&mariaFlagStandalone == 0}
		if e.Flags&mariaFlagPreparedXA != 0 {
			r.startXA()
		}
	case *replication.GTIDEvent:
		r.tx = txState{}
		if ev.Header.EventType == replication.GTID_EVENT {
			if u, err := uuid.FromBytes(e.SID); err == nil {
				r.tx.gtid = fmt.Sprintf("%s:%d", u, e.GNO)
				r.tx.mysqlSID, r.tx.mysqlGNO, r.tx.hasMySQL = u, e.GNO, true
			}
		}
	case *replication.GtidTaggedLogEvent:
		r.tx = txState{}
		if u, err := uuid.FromBytes(e.SID); err == nil {
			r.tx.gtid = fmt.Sprintf("%s:%s:%d", u, e.Tag, e.GNO)
			r.tx.mysqlSID, r.tx.mysqlGNO, r.tx.mysqlTag, r.tx.hasMySQL, r.tx.tagged = u, e.GNO, e.Tag, true, true
		}
	case *replication.QueryEvent:
		if strings.HasPrefix(string(e.Query), "XA ") {
			if handled, err := r.xaQuery(ctx, string(e.Query), func() error { return r.commit(ctx, ev.Header, outer) }); handled {
				return err
			}
		}
		switch q := string(e.Query); {
		case q == "BEGIN":
			r.tx.inBegin = true
		case q == "COMMIT" || q == "ROLLBACK":
			return r.commit(ctx, ev.Header, outer)
		default:
			if isDDL(e.Query) {
				r.s.schema.invalidate()
				r.s.forgetUnmarked()
				r.tableDDL(e.Query, string(e.Schema), outer.LogPos)
			} else if verb := dmlVerb(e.Query); verb != "" {
				// A session wrote with binlog_format=STATEMENT: its changes
				// have no row images and cannot be captured. Say so loudly
				// (without the statement, which may hold personal data).
				r.s.log.Error("statement-based change in the binlog cannot be captured (a session used binlog_format=STATEMENT or MIXED)",
					zap.String("statement", verb), zap.String("default_db", string(e.Schema)),
					zap.String("gtid", r.tx.gtid), zap.String("file", r.file), zap.Uint32("pos", outer.LogPos))
			}
			if !r.tx.inBegin {
				if opensTransaction(e.Query) {
					// MySQL 8.0.21+'s atomic CREATE TABLE … SELECT: the
					// CREATE, then the rows, then an XID end the transaction.
					r.tx.inBegin = true
					return nil
				}
				// A statement outside BEGIN (DDL) is a transaction of its own.
				return r.commit(ctx, ev.Header, outer)
			}
		}
	case *replication.XIDEvent:
		return r.commit(ctx, ev.Header, outer)
	case *replication.TableMapEvent:
		// Decoding schemas are built lazily, for captured tables only.
	case *replication.RowsEvent:
		return r.rows(ctx, ev.Header, outer, e)
	case *replication.TransactionPayloadEvent:
		// MySQL binlog_transaction_compression: go-mysql has already
		// decompressed the inner events; they carry no useful positions, so
		// the payload's own position stands in for them.
		for _, inner := range e.Events {
			if err := r.event(ctx, inner, outer); err != nil {
				return err
			}
		}
	case *replication.GenericEvent:
		if ev.Header.EventType == replication.XA_PREPARE_LOG_EVENT && r.tx.xa {
			if err := r.xaPrepared(ctx); err != nil {
				return err
			}
			return r.commit(ctx, ev.Header, outer)
		}
	case *replication.HeartbeatEvent:
		if r.pending != nil {
			return r.flushPending(ctx)
		}
	}
	return nil
}

func (r *reader) rows(ctx context.Context, hdr, outer *replication.EventHeader, e *replication.RowsEvent) error {
	op := canonical.OpCreate
	step := 1
	switch {
	case e.Type() == replication.EnumRowsEventTypeUpdate, hdr.EventType == replication.PARTIAL_UPDATE_ROWS_EVENT:
		// binlog_row_value_options=PARTIAL_JSON writes every update as a
		// PARTIAL_UPDATE_ROWS_EVENT, whether or not a JSON column changed.
		op, step = canonical.OpUpdate, 2
	case e.Type() == replication.EnumRowsEventTypeDelete:
		op = canonical.OpDelete
	case e.Type() == replication.EnumRowsEventTypeInsert:
	default:
		// Skipping it would lose its rows and shift every later ordinal.
		return &permanentError{fmt.Errorf("rows event of type %s at %s:%d is not one cdcout can decode; please report it",
			hdr.EventType, r.file, outer.LogPos)}
	}
	tm := e.Table
	db, name := string(tm.Schema), string(tm.Table)
	if !r.s.filter.match(db, name) {
		if d, ok := deferredOf(e); ok {
			r.tx.deferred = append(r.tx.deferred, deferredEvent{e, step})
			if r.tx.deferredBytes += len(d.data); r.tx.deferredBytes > maxDeferredBytes {
				return r.countDeferred()
			}
			return nil
		}
		r.tx.ordinal += len(e.Rows) / step
		return nil
	}
	if marked, err := r.s.foreignMarked(ctx, db); err != nil {
		return err
	} else if marked {
		// Another cdcout's state: counted, never captured (and its
		// MINIMAL images are no error).
		r.tx.ordinal += len(e.Rows) / step
		return nil
	}
	if err := r.countDeferred(); err != nil {
		return err
	}
	for _, sk := range e.SkippedColumns {
		if len(sk) > 0 {
			return &permanentError{fmt.Errorf("table %s.%s at %s:%d: row image is not FULL: the session that wrote this row ran with "+
				"binlog_row_image=MINIMAL or NOBLOB (set per session, or the server's default), so cdcout cannot build complete "+
				"before/after images. Make every writer of the table use binlog_row_image=FULL; then, to go on past the rows "+
				"already written, leave the table out of --tables, or restart with --reset-position --from now "+
				"(which discards the checkpoint and skips everything up to now)", db, name, r.file, outer.LogPos)}
		}
	}
	t, err := r.s.schema.table(ctx, tm)
	if err != nil {
		return &permanentError{fmt.Errorf("at %s:%d: %w", r.file, outer.LogPos, err)}
	}
	pos := outer.LogPos - outer.EventSize
	if outer.LogPos < outer.EventSize {
		pos = outer.LogPos
	}
	src := canonical.Source{
		Connector: "cdcout",
		Version:   r.s.cfg.Version,
		Instance:  r.s.cfg.Instance,
		DB:        db,
		Table:     name,
		ServerID:  hdr.ServerID,
		GTID:      r.tx.gtid,
		File:      r.file,
		Pos:       pos,
		TsMs:      int64(hdr.Timestamp) * 1000,
	}
	now := time.Now().UnixMilli()
	// vals holds the decoded values of the image the key is taken from
	// (the after image, else the before image); it is scratch, reused for
	// every row: the values themselves are shared with the Row, which owns
	// them.
	vals := r.vals[:0]
	defer func() {
		// Do not keep the last row's values alive until the next event.
		clear(vals)
		r.vals = vals[:0]
	}()
	var ckBuf [64]byte
	ck := ckBuf[:0]
	for i := 0; i+step <= len(e.Rows); i += step {
		ch := &canonical.Change{Op: op, Source: src, TsMs: now}
		ch.Source.Row = r.tx.ordinal
		var err error
		switch op {
		case canonical.OpCreate:
			ch.After, vals, err = decodeRow(t, e.Rows[i], vals)
		case canonical.OpDelete:
			ch.Before, vals, err = decodeRow(t, e.Rows[i], vals)
		case canonical.OpUpdate:
			if ch.Before, vals, err = decodeRow(t, e.Rows[i], vals); err == nil {
				ch.After, vals, err = decodeRow(t, e.Rows[i+1], vals)
			}
		}
		if err != nil {
			return &permanentError{fmt.Errorf("decode %s.%s row %d at %s:%d: %w", db, name, r.tx.ordinal, r.file, pos, err)}
		}
		// The key is read from the image (KeyCols), not copied into a
		// map of its own: one map less per change.
		ch.KeyCols = t.KeyNames
		if r.tx.gtid != "" {
			ck = append(append(append(ck[:0], "g:"...), r.tx.gtid...), ':')
			ch.ChangeKey = string(strconv.AppendInt(ck, int64(r.tx.ordinal), 10))
		}
		r.tx.ordinal++
		if r.tx.xa {
			r.tx.held = append(r.tx.held, ch)
			continue
		}
		r.tx.emitted++
		if err := r.h(ctx, Event{Change: ch}); err != nil {
			return &handlerError{err}
		}
	}
	return nil
}

// countDeferred decodes the transaction's deferred rows events, in order,
// to count their row images into the ordinal.
func (r *reader) countDeferred() error {
	for i, de := range r.tx.deferred {
		d, ok := deferredOf(de.e)
		if !ok {
			return fmt.Errorf("deferred rows event of %s.%s lost its data", de.e.Table.Schema, de.e.Table.Table)
		}
		if err := de.e.DecodeData(d.pos, d.data); err != nil {
			// As if the parser had failed on it: the session ends and
			// resumes at the last commit.
			return fmt.Errorf("decode rows event of %s.%s: %w", de.e.Table.Schema, de.e.Table.Table, err)
		}
		r.tx.ordinal += len(de.e.Rows) / de.step
		de.e.Rows = nil
		r.tx.deferred[i] = deferredEvent{}
	}
	r.tx.deferred, r.tx.deferredBytes = r.tx.deferred[:0], 0
	return nil
}

// decodeRow decodes one row image into a new Row, and into out (reset
// first) in column order.
func decodeRow(t *Table, vals, out []any) (canonical.Row, []any, error) {
	out = out[:0]
	if len(vals) != len(t.Columns) {
		return nil, out, fmt.Errorf("row has %d values, table map %d columns", len(vals), len(t.Columns))
	}
	size := 0
	for i := range t.Columns {
		size += t.Columns[i].size(vals[i])
	}
	var a rowBytes
	if size > 0 {
		a.buf = make([]byte, 0, size)
	}
	row := make(canonical.Row, len(vals))
	for i := range t.Columns {
		c := &t.Columns[i]
		v, err := c.decodeInto(vals[i], &a)
		if err != nil {
			return nil, out, fmt.Errorf("column %s: %w", c.Name, err)
		}
		row[c.Name] = v
		out = append(out, v)
	}
	return row, out, nil
}

// commit ends the current transaction: advance the resume point, emit a
// Commit (coalesced for empty transactions).
func (r *reader) commit(ctx context.Context, hdr, outer *replication.EventHeader) error {
	tx := r.tx
	r.tx = txState{}
	r.commits++
	if gs := r.resume.gset; gs != nil {
		switch {
		case tx.maria != nil:
			if set, ok := gs.(*gomysql.MariadbGTIDSet); ok {
				if err := set.AddSet(tx.maria); err != nil {
					return &permanentError{fmt.Errorf("track gtid %s: %w", tx.gtid, err)}
				}
			}
		case tx.hasMySQL:
			if set, ok := gs.(*gomysql.MysqlGTIDSet); ok {
				if tx.tagged {
					set.AddGTIDWithTag(tx.mysqlSID, tx.mysqlTag, tx.mysqlGNO)
				} else {
					set.AddGTID(tx.mysqlSID, tx.mysqlGNO)
				}
			}
		}
	}
	if outer.LogPos > 0 {
		r.resume.file, r.resume.pos = r.file, outer.LogPos
	}
	// Once a transaction has been read, GTIDs (when tracked) are the
	// resume point: they survive the new binlog file a restart opens.
	if r.resume.gset != nil {
		r.resume.useGTID = true
	}
	c := &Commit{
		Pos:  r.checkpointPos(),
		Held: len(r.xa) > 0,
		GTID: tx.gtid,
		Time: time.Unix(int64(hdr.Timestamp), 0).UTC(),
		Rows: tx.emitted,
	}
	if tx.emitted == 0 && time.Since(r.lastCommit) < emptyCommitEvery {
		r.pending = c
		return nil
	}
	return r.emitCommit(ctx, c)
}

func (r *reader) flushPending(ctx context.Context) error {
	c := r.pending
	return r.emitCommit(ctx, c)
}

func (r *reader) emitCommit(ctx context.Context, c *Commit) error {
	r.pending = nil
	r.lastCommit = time.Now()
	if err := r.h(ctx, Event{Commit: c}); err != nil {
		return &handlerError{err}
	}
	r.s.mu.Lock()
	r.s.emitted = c.Pos
	r.s.mu.Unlock()
	return nil
}
