package binlog

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	"github.com/google/uuid"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
)

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
		r.s.mu.Lock()
		r.s.read = c.Pos
		r.s.mu.Unlock()
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
	r.s.emitted, r.s.read = c.Pos, c.Pos
	r.s.mu.Unlock()
	return nil
}
