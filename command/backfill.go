package command

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"golang.org/x/term"

	"github.com/cdcout/cdcout/backfill"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/engine"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/state"
)

// backfillCommand is cdcout backfill: snapshot existing rows into the
// outbox, consistent with the live stream (see package backfill).
//
// The command streams for itself while it runs: it starts an in-process
// engine with the same configuration (replica id "<id>-backfill", no HTTP
// server). When a cdcout run already holds the enqueue lease of the
// instance, that engine waits as a standby and the running replica applies
// the watermarks; otherwise it takes the lease, streams from the stored
// checkpoint and applies them itself. It stops (gracefully) when the
// backfill ends.
func backfillCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "dsn", Usage: "source server DSN ($CDCOUT_DSN)"},
		&cli.StringSliceFlag{Name: "table", Usage: "table to backfill, db.table; repeatable"},
		&cli.StringSliceFlag{Name: "sink", Usage: "[NAME=]URL of a sink, as for cdcout run, or the name of a sink of --config or of the running fleet; repeatable " +
			"(default: every sink that takes the table: the config's, else the running fleet's)"},
		&cli.StringFlag{Name: "where", Usage: "SQL condition limiting the rows"},
		&cli.IntFlag{Name: "chunk-size", Value: backfill.DefaultChunkSize, Usage: "rows per chunk"},
		&cli.StringFlag{Name: "state-dsn", Usage: "server for the state database (default: --dsn) ($CDCOUT_STATE_DSN)"},
		&cli.StringFlag{Name: "state-db", Usage: "state database name (default cdcout) ($CDCOUT_STATE_DB)"},
		&cli.StringFlag{Name: "config", Usage: "YAML config file (sinks) ($CDCOUT_CONFIG)"},
		&cli.StringFlag{Name: "instance", Usage: "instance namespace (default \"default\") ($CDCOUT_INSTANCE)"},
		&cli.StringFlag{Name: "resume", Usage: "continue the backfill with this id"},
		&cli.BoolFlag{Name: "read-only", Usage: "write nothing to the source: fence chunks with binlog positions instead of watermark rows " +
			"(needs only SELECT and REPLICATION SLAVE, REPLICATION CLIENT on the source; on MySQL gtid_mode=ON; put the state database elsewhere with --state-dsn)"},
		&cli.StringFlag{Name: "log-level", Usage: "debug, info, warn or error"},
		&cli.StringFlag{Name: "log-format", Usage: "json or console"},
	}
	return &cli.Command{
		Name:      "backfill",
		Usage:     "snapshot the rows tables already have into the outbox, consistent with live changes",
		UsageText: "cdcout backfill --dsn DSN --table db.tbl [--table …] [--sink [NAME=]URL|NAME …] [--where SQL] [--chunk-size 1000] [--config FILE]\ncdcout backfill status\ncdcout backfill cancel ID",
		Description: "Rows are read in key order, chunk by chunk, between watermarks written to <state_db>_watermark.watermarks on the source,\n" +
			"and enqueued as op \"r\" by the replica holding the enqueue lease (this command's own engine when no cdcout run streams).\n" +
			"Running the same command again (or --resume ID) continues an interrupted backfill. Bad input exits with code 2.",
		Flags: flags,
		Subcommands: []*cli.Command{
			{
				Name:  "status",
				Usage: "list backfills and their progress",
				Flags: stateDBFlags(),
				Action: func(c *cli.Context) error {
					db, schema, err := deadStateDB(c)
					if err != nil {
						return err
					}
					defer db.Close()
					if err := state.Migrate(c.Context, db, schema); err != nil {
						return err
					}
					list, err := backfill.List(c.Context, db, schema)
					if err != nil {
						return err
					}
					if err := writeBackfills(c.App.Writer, list); err != nil {
						return err
					}
					signals, err := backfill.Signals(c.Context, db, schema, "", 20)
					if err != nil || len(signals) == 0 {
						return err
					}
					fmt.Fprintln(c.App.Writer, "\nSIGNALS (newest 20)")
					return writeSignals(c.App.Writer, signals)
				},
			},
			{
				Name:      "cancel",
				Usage:     "cancel a backfill; its runner stops at the next chunk, enqueued rows stay",
				ArgsUsage: "ID",
				Flags:     stateDBFlags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return ConfigErrorf("backfill cancel: want one backfill id")
					}
					db, schema, err := deadStateDB(c)
					if err != nil {
						return err
					}
					defer db.Close()
					info, err := backfill.Cancel(c.Context, db, schema, c.Args().First())
					if errors.Is(err, backfill.ErrNotFound) {
						return ConfigErrorf("%v", err)
					}
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "backfill %s: %s\n", info.ID, info.Status)
					return nil
				},
			},
		},
		Action: backfillAction,
	}
}

func writeBackfills(w io.Writer, list []backfill.Info) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTABLE\tSINKS\tSTATUS\tROWS\tESTIMATE\tLAST KEY\tMODE\tORIGIN\tUPDATED\tERROR")
	for _, b := range list {
		mode := "watermarks"
		if b.ReadOnly {
			mode = "read-only"
		}
		origin := b.Origin
		if origin == "" {
			origin = "cli"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", b.ID, b.Table, strings.Join(b.Sinks, ","), b.Status,
			b.RowsDone, b.RowsEstimate, b.LastKey, mode, origin, b.UpdatedAt.Format(time.RFC3339), b.Error)
	}
	return tw.Flush()
}

func writeSignals(w io.Writer, list []backfill.Signal) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SIGNAL\tINSTANCE\tTABLE\tSTATUS\tBACKFILL\tUPDATED\tERROR")
	for _, g := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", g.ID, g.Instance, g.Table, g.Status, g.BackfillID, g.UpdatedAt.Format(time.RFC3339), g.Error)
	}
	return tw.Flush()
}

func backfillAction(c *cli.Context) error {
	cfg, names, tables, err := backfillConfig(c)
	if err != nil {
		return err
	}
	logger, err := newLogger(c.App.ErrWriter, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()

	source, err := openMySQL(cfg.DSN.Value())
	if err != nil {
		return ConfigErrorf("--dsn: %s", scrub(err, cfg))
	}
	defer source.Close()
	stateDB := source
	if cfg.StateDSN != "" {
		if stateDB, err = openMySQL(cfg.StateDSN.Value()); err != nil {
			return ConfigErrorf("--state-dsn: %s", scrub(err, cfg))
		}
		defer stateDB.Close()
	}
	ctx := c.Context
	if err := source.PingContext(ctx); err != nil {
		return &scrubbedError{msg: fmt.Sprintf("connect to source %s: %s", config.DSNAddr(cfg.DSN.Value()), scrub(err, cfg)), err: err}
	}
	if err := state.Migrate(ctx, stateDB, cfg.StateDB); err != nil {
		return scrubErr(err, cfg)
	}

	// Without sinks of its own the command feeds the pipes the running
	// fleet serves, and the fleet's leader applies the chunks: no engine
	// of its own, which would have nothing to deliver to.
	b := backfillSinkResolver{cfg: cfg, own: len(cfg.Sinks) > 0}
	if !b.own {
		if b.fleet, err = readFleetSinks(ctx, stateDB, cfg); err != nil {
			return scrubErr(err, cfg)
		}
	}
	specs, err := b.specs(c, names, tables)
	if err != nil {
		return err
	}
	if !b.own && !b.fleet.leader {
		return ConfigErrorf("no cdcout run of instance %q is streaming now (no live leader in its fleet rows), and this command has no sinks of its own: "+
			"start cdcout run (it applies the backfill), or give --sink [NAME=]URL or --config with the sinks to feed", cfg.Instance)
	}
	runners, err := b.prepare(c, logger, source, stateDB, specs)
	if err != nil {
		return err
	}
	if !b.own {
		return runBackfills(c, logger, runners, cfg)
	}
	return runBackfillsWithEngine(c, logger, runners, cfg)
}

// backfillConfig loads the command's configuration: the sinks --sink names
// (names; a [NAME=]URL of its own is added to the configuration and named
// too) and the tables to backfill.
func backfillConfig(c *cli.Context) (cfg *config.Config, names, tables []string, err error) {
	var set []config.Setting
	for _, n := range []string{"dsn", "state-dsn", "state-db", "config", "instance", "log-level", "log-format"} {
		if c.IsSet(n) {
			set = append(set, config.Setting{Name: n, Value: c.String(n)})
		}
	}
	// --sink takes run's forms, [NAME=]URL (a sink of this command's own),
	// or names a sink: one of the config file's, or one the running fleet
	// serves.
	var urls []string
	for _, v := range c.StringSlice("sink") {
		if strings.Contains(v, ":") {
			set = append(set, config.Setting{Name: "sink", Value: v})
			urls = append(urls, v)
		} else {
			names = append(names, v)
		}
	}
	cfg, err = config.Load(config.Sources{Flags: set, Env: os.LookupEnv, SinksOptional: true})
	if err != nil {
		return nil, nil, nil, ConfigErrorf("config: %v", err)
	}
	for _, v := range urls {
		name, url := config.ParseSinkArg(v)
		for _, s := range cfg.Sinks {
			if (name != "" && s.Name == name) || (name == "" && s.URL == url) {
				names = append(names, s.Name)
				break
			}
		}
	}
	tables = c.StringSlice("table")
	if len(tables) == 0 && c.String("resume") == "" {
		return nil, nil, nil, ConfigErrorf("--table db.table is required (or --resume ID)")
	}
	if c.String("resume") != "" && len(tables) > 0 {
		return nil, nil, nil, ConfigErrorf("--resume continues one backfill with its own table; leave out --table")
	}
	for _, t := range tables {
		if db, name, ok := strings.Cut(t, "."); !ok || db == "" || name == "" || strings.Contains(name, ".") {
			return nil, nil, nil, ConfigErrorf("--table %q: want db.table", t)
		}
	}
	return cfg, names, tables, nil
}

// backfillSinkResolver resolves the sinks a backfill feeds: the command's
// own (own), or those the running fleet serves.
type backfillSinkResolver struct {
	cfg   *config.Config
	own   bool
	fleet fleetSinks
}

func (b backfillSinkResolver) resolve(names []string, db, table string) ([]string, error) {
	if b.own {
		return backfillSinks(b.cfg, names, db, table)
	}
	return b.fleet.resolve(b.cfg.Instance, names, db, table)
}

// specs are the backfills to run; every table's sinks are resolved before
// anything is read.
func (b backfillSinkResolver) specs(c *cli.Context, names, tables []string) ([]backfill.Spec, error) {
	specs := make([]backfill.Spec, 0, len(tables))
	for _, t := range tables {
		db, name, _ := strings.Cut(t, ".")
		sinks, err := b.resolve(names, db, name)
		if err != nil {
			return nil, err
		}
		specs = append(specs, backfill.Spec{Table: t, Sinks: sinks, Where: c.String("where"), ChunkSize: c.Int("chunk-size"), Instance: b.cfg.Instance,
			ReadOnly: c.Bool("read-only"), Origin: "cli"})
	}
	if id := c.String("resume"); id != "" {
		specs = append(specs, backfill.Spec{ResumeID: id, Instance: b.cfg.Instance})
	}
	return specs, nil
}

// prepare prepares a runner per spec (a resumed backfill's sinks must
// still resolve) and prints what each will do.
func (b backfillSinkResolver) prepare(c *cli.Context, logger *zap.Logger, source, stateDB *sql.DB, specs []backfill.Spec) ([]*backfill.Runner, error) {
	cfg := b.cfg
	runners := make([]*backfill.Runner, len(specs))
	for i, spec := range specs {
		r := &backfill.Runner{Source: source, State: stateDB, StateSchema: cfg.StateDB, Logger: logger.Named("backfill")}
		info, err := r.Prepare(c.Context, spec)
		if err != nil {
			if errors.Is(err, backfill.ErrBadInput) {
				return nil, ConfigErrorf("%s", strings.TrimPrefix(scrub(err, cfg), backfill.ErrBadInput.Error()+": "))
			}
			return nil, scrubErr(err, cfg)
		}
		if spec.ResumeID != "" {
			db, name, _ := strings.Cut(info.Table, ".")
			if _, err := b.resolve(info.Sinks, db, name); err != nil {
				return nil, err
			}
		}
		runners[i] = r
		fmt.Fprintf(c.App.Writer, "backfill %s: %s → %s\n", info.ID, info.Table, strings.Join(info.Sinks, ", "))
	}
	return runners, nil
}

// runBackfillsWithEngine runs the backfills with an in-process engine:
// standby when a cdcout run streams, the streamer otherwise.
func runBackfillsWithEngine(c *cli.Context, logger *zap.Logger, runners []*backfill.Runner, cfg *config.Config) error {
	ctx := c.Context
	ecfg := *cfg
	ecfg.ReplicaID = cfg.ReplicaID + "-backfill"
	ecfg.HTTPAddr = "off"
	ecfg.ServerID = 0
	eng, err := engine.New(&ecfg, logger, engine.WithStdout(c.App.Writer), engine.WithoutFleetBackfills())
	if err != nil {
		return ConfigErrorf("%s", scrub(err, cfg))
	}
	ectx, stopEngine := context.WithCancel(context.WithoutCancel(ctx))
	defer stopEngine()
	rctx, stopRunners := context.WithCancel(ctx)
	defer stopRunners()
	engineErr := make(chan error, 1)
	go func() {
		err := eng.Run(ectx)
		if err != nil {
			stopRunners()
		}
		engineErr <- err
	}()

	var runErr error
	for _, r := range runners {
		p := newProgressPrinter(c.App.ErrWriter, logger, r.ID())
		r.OnProgress = p.update
		err := r.Run(rctx)
		p.finish(err)
		if err != nil {
			runErr = err
			break
		}
	}
	stopEngine()
	eerr := <-engineErr
	switch {
	case eerr != nil:
		return fmt.Errorf("backfill engine: %s", scrub(eerr, cfg))
	case errors.Is(runErr, backfill.ErrCancelled):
		fmt.Fprintln(c.App.Writer, "backfill cancelled")
		return nil
	case runErr != nil && ctx.Err() != nil:
		return fmt.Errorf("backfill interrupted; run the same command again (or --resume) to continue")
	case runErr != nil:
		return scrubErr(runErr, cfg)
	}
	return nil
}

// runBackfills runs the backfills one after the other, the running
// fleet's leader applying them.
func runBackfills(c *cli.Context, logger *zap.Logger, runners []*backfill.Runner, cfg *config.Config) error {
	for _, r := range runners {
		p := newProgressPrinter(c.App.ErrWriter, logger, r.ID())
		r.OnProgress = p.update
		err := r.Run(c.Context)
		p.finish(err)
		switch {
		case errors.Is(err, backfill.ErrCancelled):
			fmt.Fprintln(c.App.Writer, "backfill cancelled")
			return nil
		case err != nil && c.Context.Err() != nil:
			return fmt.Errorf("backfill interrupted; run the same command again (or --resume) to continue")
		case err != nil:
			return scrubErr(err, cfg)
		}
	}
	return nil
}

// fleetSinks is what the running replicas of an instance deliver to.
type fleetSinks struct {
	sinks  []inspect.ServedSink
	leader bool // a live replica holds the enqueue lease
}

// readFleetSinks reads the instance's live (not stale, not stopped) fleet
// rows.
func readFleetSinks(ctx context.Context, db *sql.DB, cfg *config.Config) (fleetSinks, error) {
	f, err := inspect.Reader{DB: db, Schema: cfg.StateDB, Instance: cfg.Instance}.Fleet(ctx)
	if err != nil {
		return fleetSinks{}, fmt.Errorf("read the fleet of instance %q: %w", cfg.Instance, err)
	}
	var out fleetSinks
	seen := map[string]bool{}
	for _, r := range f.Replicas {
		if r.Stale || r.Payload.Role == inspect.RoleStopped {
			continue
		}
		if r.Payload.Role == inspect.RoleLeader {
			out.leader = true
		}
		for _, s := range r.Payload.Sinks {
			if !seen[s.Name] {
				seen[s.Name] = true
				out.sinks = append(out.sinks, s)
			}
		}
	}
	return out, nil
}

// resolve is backfillSinks for the fleet's sinks.
func (f fleetSinks) resolve(instance string, names []string, db, name string) ([]string, error) {
	var all, serving []string
	for _, s := range f.sinks {
		all = append(all, s.Name)
		if s.Serves(db, name) {
			serving = append(serving, s.Name)
		}
	}
	slices.Sort(all)
	if len(all) == 0 {
		return nil, ConfigErrorf("no running cdcout run of instance %q says which sinks it serves (none is running, or it is older): "+
			"start one, or give --sink [NAME=]URL or --config with the sinks to feed", instance)
	}
	if len(names) == 0 {
		if len(serving) == 0 {
			return nil, ConfigErrorf("the running fleet of instance %q delivers nothing of %s.%s (its sinks: %s); give --sink [NAME=]URL to feed another sink",
				instance, db, name, strings.Join(all, ", "))
		}
		return serving, nil
	}
	for _, n := range names {
		if !slices.Contains(all, n) {
			return nil, ConfigErrorf("--sink %q: the running fleet of instance %q has no such sink (its sinks: %s)", n, instance, strings.Join(all, ", "))
		}
		if !slices.Contains(serving, n) {
			return nil, ConfigErrorf("--sink %q does not take %s.%s in the running fleet (its tables: filter or --tables leave it out)", n, db, name)
		}
	}
	return names, nil
}

// backfillSinks resolves --sink names for db.name: each must be configured
// and subscribed to the table; none given means every subscribed sink.
func backfillSinks(cfg *config.Config, names []string, db, name string) ([]string, error) {
	var configured, subscribed []string
	for _, s := range cfg.Sinks {
		configured = append(configured, s.Name)
		if s.Tables.Matches(db, name) {
			subscribed = append(subscribed, s.Name)
		}
	}
	if len(names) == 0 {
		if len(subscribed) == 0 {
			return nil, ConfigErrorf("no configured sink subscribes to %s.%s (sinks: %s); name one with --sink or add the table to a sink's tables:", db, name, strings.Join(configured, ", "))
		}
		return subscribed, nil
	}
	for _, n := range names {
		if !slices.Contains(configured, n) {
			return nil, ConfigErrorf("--sink %q: no such sink (configured: %s)", n, strings.Join(configured, ", "))
		}
		if !slices.Contains(subscribed, n) {
			return nil, ConfigErrorf("--sink %q does not subscribe to %s.%s (its tables: filter leaves it out)", n, db, name)
		}
	}
	return names, nil
}

func openMySQL(dsn string) (*sql.DB, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("not a valid DSN (user:password@tcp(host:3306)/): %w", err)
	}
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(8)
	return db, nil
}

// progressPrinter draws a bar on a terminal and logs a line every few
// seconds otherwise.
type progressPrinter struct {
	w       io.Writer
	log     *zap.Logger
	id      string
	tty     bool
	start   time.Time
	last    time.Time
	startAt int64
	p       backfill.Progress
	drawn   bool
}

func newProgressPrinter(w io.Writer, log *zap.Logger, id string) *progressPrinter {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	return &progressPrinter{w: w, log: log, id: id, tty: tty, start: time.Now(), startAt: -1}
}

func (p *progressPrinter) update(pr backfill.Progress) {
	p.p = pr
	if p.startAt < 0 {
		p.startAt = pr.Rows
	}
	now := time.Now()
	if p.tty {
		if now.Sub(p.last) < 200*time.Millisecond {
			return
		}
		p.last = now
		fmt.Fprintf(p.w, "\r%s", p.line(now))
		p.drawn = true
		return
	}
	if now.Sub(p.last) < 5*time.Second {
		return
	}
	p.last = now
	rate, eta := p.rate(now)
	p.log.Info("backfill progress", zap.String("backfill", p.id), zap.Int64("rows", pr.Rows), zap.Int64("enqueued", pr.Enqueued),
		zap.Int64("estimate", pr.Estimate), zap.Float64("rows_per_s", rate), zap.Duration("eta", eta))
}

func (p *progressPrinter) rate(now time.Time) (float64, time.Duration) {
	el := now.Sub(p.start).Seconds()
	if el <= 0 {
		return 0, 0
	}
	rate := float64(p.p.Rows-p.startAt) / el
	var eta time.Duration
	if rate > 0 && p.p.Estimate > p.p.Rows {
		eta = time.Duration(float64(p.p.Estimate-p.p.Rows) / rate * float64(time.Second)).Round(time.Second)
	}
	return rate, eta
}

func (p *progressPrinter) line(now time.Time) string {
	const width = 30
	frac := 0.0
	if p.p.Estimate > 0 {
		frac = min(float64(p.p.Rows)/float64(p.p.Estimate), 1)
	}
	n := int(frac * width)
	rate, eta := p.rate(now)
	return fmt.Sprintf("%s [%s%s] %d/~%d rows  %.0f rows/s  ETA %s ", p.id, strings.Repeat("#", n), strings.Repeat(".", width-n),
		p.p.Rows, p.p.Estimate, rate, eta)
}

func (p *progressPrinter) finish(err error) {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
	if err == nil {
		p.log.Info("backfill done", zap.String("backfill", p.id), zap.Int64("rows", p.p.Rows), zap.Int64("enqueued", p.p.Enqueued),
			zap.Duration("took", time.Since(p.start).Round(time.Millisecond)))
	}
}
