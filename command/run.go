package command

import (
	"fmt"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/engine"
	"github.com/cdcout/cdcout/internal/gctune"
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
	{name: "backfill-chunk-size", usage: "rows per chunk of the fleet's backfills: snapshot: initial, signals, POST /v1/backfills (default 1000)"},
	{name: "binlog-runway-min", usage: "/readyz fails while the source may purge the checkpoint's binlog file sooner than this, e.g. 6h (default 0: off)"},
	{name: "handoff-buffer-size", usage: "changes a standby replica buffers for a takeover (default 10000)"},
	{name: "dedup-window", usage: "how long enqueue claims are kept (default max(60s, 4 x lease TTL))"},
	{name: "enqueue-batch-size", usage: "outbox rows per enqueue transaction (default 1000)"},
	{name: "enqueue-flush-interval", usage: "longest a change waits before its batch is written (default 20ms)"},
	{name: "enqueue-max-buffer", usage: "buffered rows before a mid-transaction flush (default 5000)"},
	{name: "enqueue-pipeline", usage: "read the next batch while one enqueue transaction is in flight (default true; --enqueue-pipeline=false to write each batch before reading on)", bool: true},
	{name: "segment-format", usage: "segment format enqueues write: auto (2 while every replica of the fleet reads it, else 1), 1, or 2 (default auto)"},
	{name: "shutdown-timeout", usage: "how long a stop waits for in-flight deliveries (default 30s)"},
	{name: "max-row-bytes", usage: "dead-letter a change whose row images exceed this many bytes, e.g. 16MiB (default 0: no ceiling)"},
	{name: "admin-token", usage: "bearer token of the admin API's write endpoints (POST /v1/…); without it (or --admin-token-file) they are off"},
	{name: "admin-token-file", usage: "file holding the admin token (trailing newline ignored)"},
	{name: "admin-addr", usage: "serve the admin API on this host:port instead of --http-addr"},
	{name: "admin-read-auth", usage: "put the read endpoints (/v1/*, /metrics) behind the admin token too", bool: true},
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
	cfg, err := config.Load(config.Sources{Flags: set, Env: os.LookupEnv})
	if err != nil {
		return ConfigErrorf("config: %v", err)
	}
	logger, err := newLogger(c.App.ErrWriter, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	if limit, soft := gctune.Container(); limit > 0 {
		logger.Info("soft memory limit set from the container's (set GOMEMLIMIT to choose another)",
			zap.Int64("container_limit_bytes", limit), zap.Int64("soft_limit_bytes", soft))
	}
	if cfg.ResetPosition {
		logger.Warn("--reset-position is set: the stored checkpoint will be discarded and capture starts at --from")
	}
	e, err := engine.New(cfg, logger, engine.WithStdout(c.App.Writer))
	if err != nil {
		return ConfigErrorf("%s", scrub(err, cfg))
	}
	stopTracing, err := startTracing(c.Context, cfg, logger)
	if err != nil {
		return ConfigErrorf("%s", scrub(err, cfg))
	}
	defer stopTracing()
	if err := e.Run(c.Context); err != nil {
		// Exit code and hint: classify, shared by every command.
		return scrubErr(err, cfg)
	}
	return nil
}

// scrubErr is err with a scrubbed message, still unwrapping to err.
func scrubErr(err error, cfg *config.Config) error {
	return &scrubbedError{msg: scrub(err, cfg), err: err}
}

// scrub makes err one line and redacts it by structure
// (config.RedactText), in case a lower layer quoted a DSN or a secret.
func scrub(err error, cfg *config.Config) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	var secrets []string
	if t := cfg.AdminTokenValue(); t != "" {
		secrets = append(secrets, t.Value())
	}
	for _, dsn := range []config.DSN{cfg.DSN, cfg.StateDSN} {
		if mc, perr := mysql.ParseDSN(dsn.Value()); perr == nil && mc.Passwd != "" {
			secrets = append(secrets, mc.Passwd)
		}
	}
	return config.RedactText(msg, secrets...)
}
