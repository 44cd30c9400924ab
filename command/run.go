package command

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/urfave/cli/v2"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/engine"
)

// sinkList collects repeated --sink values without splitting them on
// commas (a kafka:// URL lists brokers with commas).
type sinkList struct{ vals []string }

func (s *sinkList) Set(v string) error { s.vals = append(s.vals, v); return nil }
func (s *sinkList) String() string     { return strings.Join(s.vals, " ") }

// runFlags are cdcout run's flags. Names are a contract (scripts rely on
// them); each also reads CDCOUT_<NAME> and the YAML key <name> with '_'.
var runFlags = []struct {
	name, usage string
	bool        bool
}{
	{name: "dsn", usage: "source server DSN, user:pass@tcp(host:3306)/"},
	{name: "state-dsn", usage: "server for cdcout's state database (default: --dsn)"},
	{name: "state-db", usage: "state database name (default cdcout); created and migrated on start, never captured"},
	{name: "config", usage: "YAML config file"},
	{name: "tables", usage: "tables to capture, comma-separated patterns db.table, db.* (default: all)"},
	{name: "instance", usage: "namespace of pipes, leases and checkpoints (default \"default\")"},
	{name: "replica-id", usage: "this replica's id (default: hostname)"},
	{name: "server-id", usage: "replication client server id (default: derived from instance and replica id)"},
	{name: "from", usage: "start when there is no checkpoint: now, start, GTID set or file:pos (default now)"},
	{name: "reset-position", usage: "DISCARD the checkpoint and start at --from", bool: true},
	{name: "change-identity", usage: "auto, gtid or digest (default auto)"},
	{name: "log-level", usage: "debug, info, warn or error (default info)"},
	{name: "log-format", usage: "json or console (default: console on a terminal)"},
	{name: "retention-hours", usage: "keep delivered and dead outbox rows this long (default 72)"},
	{name: "lease-ttl", usage: "enqueue lease TTL (default 15s)"},
	{name: "claim-lease", usage: "delivery claim lease, must exceed every sink timeout (default 5m)"},
	{name: "http-addr", usage: "health/inspect listen address or off (default 127.0.0.1:8080)"},
	{name: "http-keep-alive", usage: "inspect server idle keep-alive timeout; keep it above your proxy's idle timeout (default 72s)"},
	{name: "http-headers-timeout", usage: "inspect server header read deadline, must exceed --http-keep-alive (default keep-alive + 5s)"},
	{name: "handoff-buffer-size", usage: "changes a standby replica buffers for a takeover (default 10000)"},
	{name: "max-row-bytes", usage: "dead-letter a change whose row images exceed this many bytes, e.g. 16MiB (default 0: no ceiling)"},
}

func runCommand() *cli.Command {
	sinks := &sinkList{}
	flags := []cli.Flag{
		&cli.GenericFlag{Name: "sink", Value: sinks, Usage: "[NAME=]URL of a sink: stdout:, file:///path.jsonl, http(s)://…; repeatable ($CDCOUT_SINK, space-separated)"},
	}
	for _, f := range runFlags {
		usage := f.usage + " ($" + config.EnvName(f.name) + ")"
		if f.bool {
			flags = append(flags, &cli.BoolFlag{Name: f.name, Usage: usage})
		} else {
			flags = append(flags, &cli.StringFlag{Name: f.name, Usage: usage})
		}
	}
	return &cli.Command{
		Name:  "run",
		Usage: "capture row changes into the outbox and deliver them to the sinks",
		Description: "Settings come from flags, then CDCOUT_* environment variables, then the --config file, then defaults.\n" +
			"Config errors exit with code 2.",
		Flags: flags,
		Action: func(c *cli.Context) error {
			var set []config.Setting
			for _, f := range runFlags {
				if !c.IsSet(f.name) {
					continue
				}
				v := c.String(f.name)
				if f.bool {
					v = fmt.Sprint(c.Bool(f.name))
				}
				set = append(set, config.Setting{Name: f.name, Value: v})
			}
			for _, v := range sinks.vals {
				set = append(set, config.Setting{Name: "sink", Value: v})
			}
			return runAction(c, set)
		},
	}
}

func runAction(c *cli.Context, set []config.Setting) error {
	cfg, err := config.Resolve(config.Sources{Flags: set, Env: os.LookupEnv})
	if err != nil {
		return ConfigErrorf("config: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		return ConfigErrorf("config: %v", err)
	}
	logger, err := newLogger(c.App.ErrWriter, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	if cfg.ResetPosition {
		logger.Warn("--reset-position is set: the stored checkpoint will be discarded and capture starts at --from")
	}
	e, err := engine.New(cfg, logger, engine.WithStdout(c.App.Writer))
	if err != nil {
		return ConfigErrorf("%s", scrub(err, cfg))
	}
	if err := e.Run(c.Context); err != nil {
		msg := scrub(err, cfg)
		var me *mysql.MySQLError
		switch {
		case errors.As(err, &me) && (me.Number == 1045 || me.Number == 1044 || me.Number == 1049):
			// Wrong password, no access, unknown database: fix the DSN.
			return ConfigErrorf("%s (check the user, password and database in the DSN)", msg)
		case errors.Is(err, binlog.ErrServerNotReady):
			return ConfigErrorf("%s", msg)
		}
		return errors.New(msg)
	}
	return nil
}

// scrub makes err one line and removes any password of the configured
// DSNs from it, in case a lower layer quoted one.
func scrub(err error, cfg *config.Config) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	for _, dsn := range []config.DSN{cfg.DSN, cfg.StateDSN} {
		if mc, perr := mysql.ParseDSN(dsn.Value()); perr == nil && mc.Passwd != "" {
			msg = strings.ReplaceAll(msg, mc.Passwd, "[redacted]")
		}
	}
	return msg
}
