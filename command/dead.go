package command

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/urfave/cli/v2"

	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/state"
)

// deadCommand inspects and re-queues dead-lettered outbox rows.
func deadCommand() *cli.Command {
	stateFlags := append(stateDBFlags(),
		&cli.StringFlag{Name: "pipe", Usage: "only rows of this pipe (<instance>:<db.table>:<sink>)"},
	)
	return &cli.Command{
		Name:  "dead",
		Usage: "list or re-queue dead-lettered outbox rows",
		Subcommands: []*cli.Command{
			{
				Name:  "list",
				Usage: "list dead rows, oldest first (a table; JSON lines with --json)",
				Flags: append(append([]cli.Flag{}, stateFlags...),
					&cli.BoolFlag{Name: "json", Usage: "print one JSON object per line"},
					&cli.IntFlag{Name: "limit", Value: 1000, Usage: "at most this many rows (0: all)"},
				),
				Action: func(c *cli.Context) error {
					db, schema, err := deadStateDB(c)
					if err != nil {
						return err
					}
					defer db.Close()
					rows, err := outbox.NewStore(db, schema, nil).DeadRows(c.Context, outbox.DeadQuery{Pipe: c.String("pipe"), Limit: c.Int("limit")})
					if err != nil {
						return err
					}
					if c.Bool("json") {
						return writeDeadJSONL(c.App.Writer, rows)
					}
					return writeDeadTable(c.App.Writer, rows)
				},
			},
			{
				Name:  "retry",
				Usage: "put dead rows back to pending with attempts reset (all, or --pipe and/or --id)",
				Flags: append(append([]cli.Flag{}, stateFlags...),
					&cli.StringFlag{Name: "id", Usage: "only the row with this id (deliveryKey)"},
				),
				Action: func(c *cli.Context) error {
					db, schema, err := deadStateDB(c)
					if err != nil {
						return err
					}
					defer db.Close()
					id := c.String("id")
					n, err := outbox.NewStore(db, schema, nil).RetryDead(c.Context, c.String("pipe"), id)
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "re-queued %d dead row%s\n", n, plural(n))
					if id != "" && n == 0 {
						return fmt.Errorf("no dead row with id %s", id)
					}
					return nil
				},
			},
		},
	}
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// deadStateDB opens the state database named by --state-dsn (or --dsn) and
// --state-db, and checks that it answers. Errors name the DSN only in its
// redacted form.
func deadStateDB(c *cli.Context) (*sql.DB, string, error) {
	dsn := c.String("state-dsn")
	flag := "--state-dsn"
	if dsn == "" {
		dsn, flag = c.String("dsn"), "--dsn"
	}
	if dsn == "" {
		return nil, "", ConfigErrorf("--dsn or --state-dsn is required (or CDCOUT_DSN / CDCOUT_STATE_DSN)")
	}
	schema := c.String("state-db")
	if err := state.CheckName(schema); err != nil {
		return nil, "", ConfigErrorf("--state-db: %v", err)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, "", ConfigErrorf("%s: %s is not a valid DSN (user:password@tcp(host:3306)/)", flag, config.RedactDSN(dsn))
	}
	cfg.ParseTime = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, "", ConfigErrorf("%s: %v", flag, err)
	}
	ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, "", fmt.Errorf("connect to state database %s: %w", config.RedactDSN(dsn), err)
	}
	if err := checkStateThere(ctx, db, schema, config.DSNAddr(dsn)); err != nil {
		db.Close()
		return nil, "", err
	}
	return db, schema, nil
}

// checkStateThere says, instead of a raw "Table 'x.checkpoints' doesn't
// exist", that there is no cdcout state where the flags point, and where
// there is some on that server.
func checkStateThere(ctx context.Context, db *sql.DB, schema, addr string) error {
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'checkpoints'", schema).Scan(&n); err != nil {
		return fmt.Errorf("look up the state database %s on %s: %w", schema, addr, err)
	}
	if n > 0 {
		return nil
	}
	// Databases holding cdcout's state: marked (state.MarkerTable), or,
	// written before the marker existed, with cdcout's checkpoints and
	// leases tables. Watermark databases hold a marker but no checkpoints.
	rows, err := db.QueryContext(ctx, "SELECT TABLE_SCHEMA FROM information_schema.TABLES WHERE TABLE_NAME IN ('checkpoints', 'leases') "+
		"GROUP BY TABLE_SCHEMA HAVING COUNT(*) = 2 ORDER BY TABLE_SCHEMA")
	if err != nil {
		return fmt.Errorf("look up the state database %s on %s: %w", schema, addr, err)
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return fmt.Errorf("look up the state database %s on %s: %w", schema, addr, err)
		}
		found = append(found, name)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("look up the state database %s on %s: %w", schema, addr, err)
	}
	where := "there is no cdcout state database on that server"
	if len(found) > 0 {
		where = "cdcout state databases there: " + strings.Join(found, ", ")
	}
	return ConfigErrorf("no cdcout state in database %s on %s (cdcout run never ran with --state-db %s against this server); "+
		"%s. Point --state-dsn (the server) and --state-db (the database) where cdcout run keeps its state", schema, addr, schema, where)
}

func writeDeadJSONL(w io.Writer, rows []outbox.DeadRow) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

func writeDeadTable(w io.Writer, rows []outbox.DeadRow) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "no dead rows")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPIPE\tOP\tKEY\tATTEMPTS\tFAILED AT\tLAST ERROR")
	for _, r := range rows {
		at := ""
		if r.LastErrorAt != nil {
			at = r.LastErrorAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Pipe, r.Op, oneLine(r.RowKey, 40),
			strconv.Itoa(r.Attempts), at, oneLine(r.LastError, 100))
	}
	return tw.Flush()
}

// oneLine keeps a table cell on one line and at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return s
}
