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
			if c.NArg() != 1 {
				return ConfigErrorf("name one sink: cdcout sink %s NAME", c.Command.Name)
			}
			sink := c.Args().First()
			db, schema, err := deadStateDB(c)
			if err != nil {
				return err
			}
			defer db.Close()
			r := inspect.Reader{DB: db, Schema: schema, Instance: c.String("instance")}
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
	return &cli.Command{
		Name:  "sink",
		Usage: "pause or resume a sink on every replica",
		Subcommands: []*cli.Command{
			{Name: "pause", Usage: "stop delivering to sink NAME (its records are kept) until it is resumed", ArgsUsage: "NAME", Flags: flags, Action: action(true)},
			{Name: "resume", Usage: "deliver to sink NAME again, from where it stopped", ArgsUsage: "NAME", Flags: flags, Action: action(false)},
		},
	}
}
