package command

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/internal/buildinfo"
)

// errLimitReached ends a tail that printed --limit changes.
var errLimitReached = errors.New("limit reached")

func tailCommand() *cli.Command {
	return &cli.Command{
		Name:  "tail",
		Usage: "print row changes and schema changes (and, with --transactions and --heartbeat, transaction records and heartbeats) as canonical JSON, one per line",
		Description: "Reads the binary log of a MySQL/MariaDB server as a replica and prints each row change\n" +
			"as a Debezium-style envelope on stdout (logs go to stderr) until interrupted or --limit is reached;\n" +
			"a CREATE, ALTER, RENAME, DROP or TRUNCATE of a captured table prints as an op \"ddl\" record\n" +
			"(statement and column lists, docs/formats.md) where it happened among the rows; with --transactions,\n" +
			"an op \"tx\" BEGIN before each transaction's first change and END after its last, with the counts,\n" +
			"and source.tx on each change (the stored envelopes of a sink with transactions: true).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dsn", Required: true, EnvVars: []string{"CDCOUT_DSN"},
				Usage: "go-sql-driver DSN of the source, e.g. user:pass@tcp(host:3306)/?tls=true"},
			&cli.StringFlag{Name: "tables", Usage: "comma-separated table patterns: db.tbl, db.*, *.tbl (default all)"},
			&cli.StringFlag{Name: "from", Value: "now", Usage: "start position: now, start, a GTID set, or file:pos"},
			&cli.UintFlag{Name: "server-id", DefaultText: "random", Usage: "replica server id, unique in the topology"},
			&cli.IntFlag{Name: "limit", DefaultText: "none",
				Usage: "stop after N records (changes and schema changes; with --transactions, at the END of the transaction holding the Nth)"},
			&cli.StringFlag{Name: "instance", Usage: "instance name for the envelope's source block"},
			&cli.DurationFlag{Name: "heartbeat", DefaultText: "off",
				Usage: `print an "hb" record with the position read whenever nothing was printed for this long`},
			&cli.BoolFlag{Name: "transactions",
				Usage: `print "tx" records (BEGIN, END with counts) around each transaction and source.tx on its changes`},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
			&cli.StringFlag{Name: "log-format", Usage: "json or console (default: console on a terminal)"},
		},
		Action: runTail,
	}
}

func runTail(c *cli.Context) error {
	logger, err := newLogger(c.App.ErrWriter, c.String("log-level"), c.String("log-format"))
	if err != nil {
		return err
	}
	defer logger.Sync()

	dsn, err := binlog.ParseDSN(c.String("dsn"))
	if err != nil {
		return ConfigErrorf("--dsn: %v", err)
	}
	if c.Int("limit") < 0 {
		return ConfigErrorf("--limit: must not be negative")
	}
	if _, err := binlog.ParseFrom(c.String("from")); err != nil {
		return ConfigErrorf("%v", err)
	}
	var tables []string
	for _, p := range strings.Split(c.String("tables"), ",") {
		if p = strings.TrimSpace(p); p != "" {
			tables = append(tables, p)
		}
	}
	if err := binlog.CheckTablePatterns(tables); err != nil {
		return ConfigErrorf("--tables: %v", err)
	}
	serverID := uint32(c.Uint("server-id"))
	if c.IsSet("server-id") && (serverID == 0 || c.Uint("server-id") > 1<<32-1) {
		return ConfigErrorf("--server-id: must be between 1 and 4294967295")
	}
	if serverID == 0 {
		serverID = randomServerID()
		logger.Info("using a random replica server id", zap.Uint32("server_id", serverID))
	}

	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	s, err := binlog.Open(ctx, binlog.Config{
		DSN:      dsn.FormatDSN(),
		ServerID: serverID,
		From:     c.String("from"),
		Include:  tables,
		Instance: c.String("instance"),
		Version:  buildinfo.Version(),
		Logger:   logger,
		// tail has no sinks to opt in: schema changes are always shown.
		DDLRecords: true,
	})
	if err != nil {
		return err
	}
	defer s.Close()

	limit := c.Int("limit")
	p := &tailPrinter{out: bufio.NewWriterSize(c.App.Writer, tailBufferBytes), buf: make([]byte, 0, 4096), last: time.Now()}
	if c.Bool("transactions") {
		p.tx = &tailTx{instance: c.String("instance")}
	}
	var bg sync.WaitGroup
	bgCtx, stopBG := context.WithCancel(ctx)
	defer func() {
		stopBG()
		bg.Wait()
	}()
	bg.Add(1)
	go func() {
		defer bg.Done()
		p.flushes(bgCtx, cancel)
	}()
	if every := c.Duration("heartbeat"); every > 0 {
		bg.Add(1)
		go func() {
			defer bg.Done()
			p.heartbeats(bgCtx, every, s, c.String("instance"), cancel)
		}()
	}
	// The envelopes are encoded and written on a goroutine of their own
	// (binlog.Pipeline), beside the reading; a write error there ends the
	// tail at once (cancel), not at the next change.
	pipe := binlog.NewPipeline(func(ev binlog.Event) error {
		var err error
		if ev.Commit != nil {
			err = p.committed(ev.Commit)
		} else {
			err = p.change(ev.Change)
		}
		if err != nil {
			cancel()
		}
		return err
	})
	// Changes and schema changes queued (--limit; once the pipeline is
	// closed without an error, all of them printed), and whether a
	// transaction's rows are among them without its commit.
	n, inTx := 0, false
	err = s.Run(ctx, func(ctx context.Context, ev binlog.Event) error {
		if err := pipe.Handle(ctx, ev); err != nil {
			return err
		}
		if ev.Commit != nil {
			inTx = false
			if limit > 0 && p.tx != nil && n >= limit {
				return errLimitReached
			}
			return nil
		}
		n++
		inTx = inTx || ev.Change.Op != canonical.OpDDL
		if limit > 0 && n >= limit && (p.tx == nil || !inTx) {
			return errLimitReached
		}
		return nil
	})
	pipeErr := pipe.Close()
	stopBG()
	bg.Wait()
	if pipeErr != nil {
		return pipeErr
	}
	if err := p.writeErr(); err != nil {
		return err
	}
	switch {
	case errors.Is(err, errLimitReached):
		return nil
	case errors.Is(err, context.Canceled) && c.Context.Err() != nil:
		logger.Info("interrupted", zap.Int("changes", n), zap.Any("position", s.Position()))
		return nil
	}
	return err
}

// tailPrinter writes tail's records to stdout: the stream's, and
// heartbeats from their own goroutine. They are buffered and written at
// every commit (and schema change), when the buffer is full and, for
// anything else left, within tailFlushEvery: one write per change was a
// system call per change, more than encoding it.
type tailPrinter struct {
	out *bufio.Writer

	mu         sync.Mutex
	buf        []byte
	last       time.Time // when what was printed was last written out
	unflushed  bool      // printed since the last flush
	sourceTime time.Time // the last commit's
	err        error     // a write error of another goroutine, which ends the tail
	tx         *tailTx   // with --transactions
}

// tailBufferBytes is how much output tail holds before writing it, and
// tailFlushEvery how long at most.
const (
	tailBufferBytes = 64 << 10
	tailFlushEvery  = 50 * time.Millisecond
)

func (p *tailPrinter) change(ch *canonical.Change) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tx != nil && ch.Op != canonical.OpDDL {
		var begin *canonical.Change
		if ch, begin = p.tx.place(ch); begin != nil {
			if err := p.print(begin); err != nil {
				return err
			}
		}
	}
	if err := p.print(ch); err != nil {
		return err
	}
	if ch.Op == canonical.OpDDL {
		// Its own event, not a transaction's rows: no commit follows.
		return p.flush()
	}
	return nil
}

// print writes one record.
func (p *tailPrinter) print(ch *canonical.Change) error {
	var err error
	if p.buf, err = canonical.AppendEnvelope(p.buf[:0], ch, ""); err != nil {
		return fmt.Errorf("encode change: %w", err)
	}
	return p.write()
}

func (p *tailPrinter) write() error {
	p.buf = append(p.buf, '\n')
	if _, err := p.out.Write(p.buf); err != nil {
		return fmt.Errorf("write stdout: %w", err)
	}
	p.unflushed = true
	return nil
}

// flush writes out what is buffered. The time of the last output is taken
// here, at a commit, a schema change or a tick, not per record: a clock
// read per change was 3 % of tail's CPU, and heartbeats need the time only
// to within a tick.
func (p *tailPrinter) flush() error {
	if err := p.out.Flush(); err != nil {
		return fmt.Errorf("write stdout: %w", err)
	}
	if p.unflushed {
		p.last, p.unflushed = time.Now(), false
	}
	return nil
}

// committed notes the commit time (for heartbeats), prints the END of
// the transaction it commits (--transactions) and writes what is
// buffered.
func (p *tailPrinter) committed(c *binlog.Commit) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sourceTime = c.Time
	if p.tx != nil {
		if end := p.tx.end(c); end != nil {
			if err := p.print(end); err != nil {
				return err
			}
		}
	}
	return p.flush()
}

// flushes writes what is buffered every tailFlushEvery until ctx ends,
// and once more then; a write error stops the tail (stop).
func (p *tailPrinter) flushes(ctx context.Context, stop func()) {
	t := time.NewTicker(tailFlushEvery)
	defer t.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-t.C:
		}
		p.mu.Lock()
		if p.out.Buffered() > 0 || p.unflushed {
			if err := p.flush(); err != nil && p.err == nil {
				p.err = err
				stop()
			}
		}
		p.mu.Unlock()
	}
}

// writeErr returns the write error of the flushing or heartbeat
// goroutine, if one ended the tail.
func (p *tailPrinter) writeErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// heartbeats prints an "hb" record (canonical.MarshalHeartbeat) with the
// position read whenever nothing was printed for every, until ctx ends;
// a write error stops the tail (stop).
func (p *tailPrinter) heartbeats(ctx context.Context, every time.Duration, s *binlog.Stream, instance string, stop func()) {
	t := time.NewTicker(max(every/5, 20*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p.mu.Lock()
			if now.Sub(p.last) >= every {
				pos := s.Position()
				b, err := canonical.MarshalHeartbeat(canonical.Heartbeat{Instance: instance, Version: buildinfo.Version(),
					ServerID: s.Info().ServerID, File: pos.File, Pos: pos.Pos, GTIDSet: pos.GTIDSet, SourceTime: p.sourceTime, Time: now}, "")
				if err == nil {
					p.buf = append(p.buf[:0], b...)
					if err = p.write(); err == nil {
						err = p.flush()
					}
				}
				if err != nil && p.err == nil {
					p.err = err
					stop()
				}
			}
			p.mu.Unlock()
		}
	}
}

// randomServerID picks an id from a range real servers rarely use, so an
// ad-hoc tail does not collide with a configured replica.
func randomServerID() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return 1<<30 + binary.BigEndian.Uint32(b[:])%(1<<30)
}
