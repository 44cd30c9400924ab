package state

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Open opens a connection pool for the state database.
//
// Every connection runs in UTC (time_zone '+00:00'): commit times are
// written from Go in UTC and compared with NOW(6), so both must be in one
// zone whatever the server's default is.
//
// Each connection also tries binlog_row_image=MINIMAL. The state tables are
// written on every change and every delivery, and under FULL images each
// status update logs the whole payload twice (before and after): measured
// ~4,300 binlog bytes per change against ~1,900 with MINIMAL. The setting
// needs SUPER or BINLOG ADMIN; without it the connection keeps the server's
// image and MinimalRowImage reports false, which costs only binlog volume.
// Every state table has a primary key, so MINIMAL images replicate safely.
//
// On MariaDB each connection also turns binlog_annotate_row_events off
// (on by default): with it the server logs every statement's text beside
// its row events, so each segment INSERT's payload literal went to the
// binary log twice (BenchmarkKafkaEndToEnd narrow: 375 state binlog bytes
// per change with it, 178 without). The annotation is for people reading
// the binlog; the state tables' row images say what changed. A server
// that refuses the setting keeps annotating, which costs only binlog
// volume.
//
// Statements from a connection in UTF-8 (the driver's default) are read
// by the server as character_set_client=binary: the statement text is the
// same, and a literal still takes the connection's character set
// (character_set_connection, unchanged), but the lexer no longer asks of
// every byte of a literal whether it starts a multi-byte character. That
// was a quarter of the database's CPU for a segment INSERT, whose payload
// literal is most of its text (BenchmarkSegmentInsert: 2.9 µs a record,
// 2.1 µs with it). In UTF-8 a quote or a backslash is never part of a
// multi-byte character, so reading byte by byte finds the same literals.
// A DSN that names another charset, or sets character_set_client, keeps
// what it asks for.
//
// idleLimit, when positive, becomes the session's wait_timeout (whole
// seconds, at least 2): the server closes a connection that sends nothing
// for that long and rolls its transaction back. A replica frozen inside an
// enqueue transaction (SIGSTOP, a VM pause, a GC stall) otherwise keeps its
// row locks — on the lease row and on the claims — for as long as its
// socket stays open, and the takeover that fencing exists for blocks behind
// them (seen in e2e TestChaos: no takeover within 30 s of a SIGSTOP). A live
// process never idles mid-transaction for seconds; idle pooled connections
// are recycled before the server would close them.
func Open(dsn string, idleLimit time.Duration) (*Pool, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse state DSN: %w", err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["time_zone"] = "'+00:00'"
	if binaryClientSafe(dsn, cfg) {
		cfg.Params["character_set_client"] = "binary"
	}
	cfg.Loc = time.UTC
	if idleLimit > 0 {
		secs := max(int(idleLimit/time.Second), 2)
		cfg.Params["wait_timeout"] = strconv.Itoa(secs)
	}
	// Arguments are interpolated into the statement by the driver (one
	// COM_QUERY) instead of server-side prepared statements (prepare,
	// execute, close: three round trips). Above all, a server with the
	// binary log on expands every prepared statement's parameters into a
	// logged query text: it escaped each segment payload byte by byte and
	// converted it once more, a quarter of the database's CPU per change,
	// and the prepares another tenth (perf of mariadbd under
	// BenchmarkKafkaEndToEnd). The driver refuses interpolation under a
	// few multi-byte collations that make it unsafe; those keep prepared
	// statements.
	cfg.InterpolateParams = true
	base, err := mysql.NewConnector(cfg)
	if err != nil {
		cfg.InterpolateParams = false
		if base, err = mysql.NewConnector(cfg); err != nil {
			return nil, fmt.Errorf("state DSN: %w", err)
		}
	}
	p := &Pool{}
	p.minimal.Store(true)
	p.annotate.Store(true)
	p.DB = sql.OpenDB(&minimalImageConnector{Connector: base, pool: p})
	p.readCommitted = sql.OpenDB(&minimalImageConnector{Connector: base, pool: p, readCommitted: true})
	p.readCommitted.SetMaxOpenConns(readCommittedConns)
	p.readCommitted.SetMaxIdleConns(readCommittedConns)
	if idleLimit > 0 {
		p.SetConnMaxIdleTime(max(idleLimit/2, time.Second))
		p.readCommitted.SetConnMaxIdleTime(max(idleLimit/2, time.Second))
	}
	return p, nil
}

// readCommittedConns bounds the ReadCommitted pool: two enqueue
// transactions are in flight at a time (the second committing after the
// first, outbox.Batch.After), and a retry may overlap a connection still
// being closed.
const readCommittedConns = 3

// ReadCommitted is a second, small pool over the same server and settings
// whose sessions run their transactions at READ COMMITTED, so a
// transaction that needs it begins with START TRANSACTION alone:
// BeginTx with an isolation level sends SET TRANSACTION first, a round
// trip of its own. The enqueue transaction (outbox.Store.WithReadCommitted)
// begins there: on a backlog its begin, two round trips each taking about
// a millisecond on a busy 2-core box while the server spent 0.1 ms on
// them, was a fifth of the transaction. Only transactions asking for READ
// COMMITTED belong there; statements outside one keep the main pool,
// where a lease JOIN or a locking read keeps the server's isolation.
func (p *Pool) ReadCommitted() *sql.DB { return p.readCommitted }

// Close closes both pools.
func (p *Pool) Close() error {
	return errors.Join(p.DB.Close(), p.readCommitted.Close())
}

// Pool is the state database's *sql.DB plus what its connections learned.
type Pool struct {
	*sql.DB
	minimal atomic.Bool
	// annotate: still worth asking for binlog_annotate_row_events=OFF
	// (false once a connection was refused it or the server has no such
	// variable, as MySQL has not).
	annotate atomic.Bool
	// readCommitted: see ReadCommitted.
	readCommitted *sql.DB
}

// MinimalRowImage reports whether the connections log MINIMAL row images
// (false once one connection was refused the setting).
func (p *Pool) MinimalRowImage() bool { return p.minimal.Load() }

type minimalImageConnector struct {
	driver.Connector
	pool *Pool
	// readCommitted: the session's transactions run at READ COMMITTED.
	readCommitted bool
}

func (c *minimalImageConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return conn, err
	}
	ex, ok := conn.(driver.ExecerContext)
	if !ok {
		if c.readCommitted {
			conn.Close()
			return nil, errors.New("state connection cannot run statements of its own")
		}
		c.pool.minimal.Store(false)
		c.pool.annotate.Store(false)
		return conn, nil
	}
	if c.readCommitted {
		// Standard syntax in both flavours, for the session's later
		// transactions; a server refusing it is not one cdcout runs on.
		if _, err := ex.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", nil); err != nil {
			conn.Close()
			return nil, fmt.Errorf("state session isolation READ COMMITTED: %w", err)
		}
	}
	// Not privileged, or no such variable: keep the server's default on
	// this and every later connection (no point asking again).
	if c.pool.minimal.Load() {
		if _, err := ex.ExecContext(ctx, "SET SESSION binlog_row_image = 'MINIMAL'", nil); err != nil {
			c.pool.minimal.Store(false)
		}
	}
	if c.pool.annotate.Load() {
		if _, err := ex.ExecContext(ctx, "SET SESSION binlog_annotate_row_events = OFF", nil); err != nil {
			c.pool.annotate.Store(false)
		}
	}
	return conn, nil
}

// binaryClientSafe reports whether the connection's statements are UTF-8,
// so the server may read them byte by byte (see Open): the DSN names no
// charset other than utf8mb4 or utf8 and no other collation, and does not
// set character_set_client itself.
func binaryClientSafe(dsn string, cfg *mysql.Config) bool {
	if _, ok := cfg.Params["character_set_client"]; ok {
		return false
	}
	utf8 := func(name string) bool {
		name = strings.ToLower(name)
		return name == "utf8mb4" || name == "utf8" || name == "utf8mb3" ||
			strings.HasPrefix(name, "utf8mb4_") || strings.HasPrefix(name, "utf8_") || strings.HasPrefix(name, "utf8mb3_")
	}
	if cfg.Collation != "" && !utf8(cfg.Collation) {
		return false
	}
	// The driver keeps the charset parameter to itself; read it the way
	// ParseDSN finds parameters, after the last '/'.
	slash := strings.LastIndexByte(dsn, '/')
	q := strings.IndexByte(dsn[slash+1:], '?')
	if q < 0 {
		return true
	}
	params, err := url.ParseQuery(dsn[slash+1+q+1:])
	if err != nil {
		return false
	}
	for _, list := range params["charset"] {
		for _, cs := range strings.Split(list, ",") {
			if !utf8(cs) {
				return false
			}
		}
	}
	return true
}
