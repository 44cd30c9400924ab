package command

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/cdcout/cdcout/fleet"
)

// fleetCommand manages the replicas table's observation rows.
func fleetCommand() *cli.Command {
	return &cli.Command{
		Name:  "fleet",
		Usage: "manage fleet observation rows",
		Subcommands: []*cli.Command{
			{
				Name:      "forget",
				Usage:     "remove a replica that is gone for good (a scale-down) from the fleet view",
				ArgsUsage: "REPLICA_ID",
				Flags:     stateDBFlags(),
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return ConfigErrorf("fleet forget: give exactly one replica id")
					}
					id := c.Args().First()
					db, schema, err := deadStateDB(c)
					if err != nil {
						return err
					}
					defer db.Close()
					n, err := fleet.Forget(c.Context, db, schema, id)
					if err != nil {
						return err
					}
					if n == 0 {
						return fmt.Errorf("no fleet rows for replica %s", id)
					}
					fmt.Fprintf(c.App.Writer, "forgot replica %s (%d row%s)\n", id, n, plural(n))
					return nil
				},
			},
		},
	}
}
