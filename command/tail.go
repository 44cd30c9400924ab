package command

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

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
		Usage: "print row changes and schema changes as canonical JSON envelopes, one per line",
		Description: "Reads the binary log of a MySQL/MariaDB server as a replica and prints each row change\n" +
			"as a Debezium-style envelope on stdout (logs go to stderr) until interrupted or --limit is reached;\n" +
			"a CREATE, ALTER, RENAME, DROP or TRUNCATE of a captured table prints as an op \"ddl\" record\n" +
			"(statement and column lists, docs/formats.md) where it happened among the rows.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dsn", Required: true, EnvVars: []string{"CDCOUT_DSN"},
				Usage: "go-sql-driver DSN of the source, e.g. user:pass@tcp(host:3306)/?tls=true"},
			&cli.StringFlag{Name: "tables", Usage: "comma-separated table patterns: db.tbl, db.*, *.tbl (default all)"},
			&cli.StringFlag{Name: "from", Value: "now", Usage: "start position: now, start, a GTID set, or file:pos"},
			&cli.UintFlag{Name: "server-id", DefaultText: "random", Usage: "replica server id, unique in the topology"},
			&cli.IntFlag{Name: "limit", DefaultText: "none", Usage: "stop after N records (changes and schema changes)"},
			&cli.StringFlag{Name: "instance", Usage: "instance name for the envelope's source block"},
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
	out := c.App.Writer
	n := 0
	buf := make([]byte, 0, 4096)
	err = s.Run(ctx, func(_ context.Context, ev binlog.Event) error {
		if ev.Change == nil {
			return nil
		}
		var err error
		if buf, err = canonical.AppendEnvelope(buf[:0], ev.Change, ""); err != nil {
			return fmt.Errorf("encode change: %w", err)
		}
		buf = append(buf, '\n')
		if _, err := out.Write(buf); err != nil {
			return fmt.Errorf("write stdout: %w", err)
		}
		n++
		if limit > 0 && n >= limit {
			return errLimitReached
		}
		return nil
	})
	switch {
	case errors.Is(err, errLimitReached):
		return nil
	case errors.Is(err, context.Canceled) && c.Context.Err() != nil:
		logger.Info("interrupted", zap.Int("changes", n), zap.Any("position", s.Position()))
		return nil
	}
	return err
}

// randomServerID picks an id from a range real servers rarely use, so an
// ad-hoc tail does not collide with a configured replica.
func randomServerID() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return 1<<30 + binary.BigEndian.Uint32(b[:])%(1<<30)
}
