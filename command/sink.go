package command

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/cdcout/cdcout/inspect"
)

// sinkCommand pauses and resumes a sink across the fleet: the control is
// a row in the state database that every replica's drainers read.
func sinkCommand() *cli.Command {
	action := func(paused bool) cli.ActionFunc {
		return func(c *cli.Context) error {
			sink, r, err := sinkReader(c, "cdcout sink "+c.Command.Name+" NAME")
			if err != nil {
				return err
			}
			defer r.DB.Close()
			changed, err := r.SetPaused(c.Context, sink, paused, "cli")
			var unknown *inspect.ErrUnknownSink
			if errors.As(err, &unknown) {
				return ConfigErrorf("%v", err)
			}
			if err != nil {
				return err
			}
			verb := map[bool]string{true: "paused", false: "resumed"}[paused]
			switch {
			case !changed:
				fmt.Fprintf(c.App.Writer, "sink %s of instance %s was already %s\n", sink, r.Instance, verb)
			case paused:
				fmt.Fprintf(c.App.Writer, "sink %s of instance %s paused: no replica delivers it until cdcout sink resume %s\n", sink, r.Instance, sink)
			default:
				fmt.Fprintf(c.App.Writer, "sink %s of instance %s resumed\n", sink, r.Instance)
			}
			return nil
		}
	}
	flags := append(stateDBFlags(),
		&cli.StringFlag{Name: "instance", EnvVars: []string{"CDCOUT_INSTANCE"}, Value: "default", Usage: "instance the sink belongs to"})
	replayFlags := append(append([]cli.Flag{}, flags...),
		&cli.StringFlag{Name: "from", Required: true, Usage: "first record to re-deliver: a GTID (0-1-42, uuid:42), a binlog position (mysql-bin.000003:1234) or an RFC 3339 time"},
		&cli.StringFlag{Name: "to", Usage: "last record to re-deliver, the same kind as --from (default: the newest the outbox holds now)"})
	return &cli.Command{
		Name:  "sink",
		Usage: "pause, resume or replay a sink on every replica",
		Subcommands: []*cli.Command{
			{Name: "pause", Usage: "stop delivering to sink NAME (its records are kept) until it is resumed", ArgsUsage: "NAME", Flags: flags, Action: action(true)},
			{Name: "resume", Usage: "deliver to sink NAME again, from where it stopped", ArgsUsage: "NAME", Flags: flags, Action: action(false)},
			{Name: "replay", Usage: "re-deliver sink NAME's records of a range again, under their original ids", ArgsUsage: "NAME", Flags: replayFlags, Action: replayAction},
		},
	}
}

// sinkReader is the sink a cdcout sink subcommand names (its one
// argument; usage shows how to name it) and a reader of the instance's
// state; the caller closes r.DB.
func sinkReader(c *cli.Context, usage string) (sink string, r inspect.Reader, err error) {
	if c.NArg() != 1 {
		return "", r, ConfigErrorf("name one sink: %s", usage)
	}
	db, schema, err := deadStateDB(c)
	if err != nil {
		return "", r, err
	}
	return c.Args().First(), inspect.Reader{DB: db, Schema: schema, Instance: c.String("instance")}, nil
}

// replayAction records a replay; the replicas holding the sink's pipes
// carry it out, and cdcout status shows its progress.
func replayAction(c *cli.Context) error {
	sink, r, err := sinkReader(c, "cdcout sink replay NAME --from …")
	if err != nil {
		return err
	}
	defer r.DB.Close()
	st, err := r.StartReplay(c.Context, sink, c.String("from"), c.String("to"), "cli")
	var (
		unknown *inspect.ErrUnknownSink
		bad     *inspect.ReplayError
	)
	if errors.As(err, &unknown) || errors.As(err, &bad) {
		return ConfigErrorf("%v", err)
	}
	if err != nil {
		return err
	}
	rng := "from " + st.From
	if st.To != "" {
		rng += " to " + st.To
	}
	fmt.Fprintf(c.App.Writer, "replay %d of sink %s of instance %s %s asked for: the replicas holding its pipes re-deliver it (cdcout status shows the progress)\n",
		st.ID, sink, r.Instance, rng)
	return nil
}
