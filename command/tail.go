package command

import (
	"errors"

	"github.com/urfave/cli/v2"
)

// tailCommand is replaced by the binlog work (issue 2).
func tailCommand() *cli.Command {
	return &cli.Command{
		Name:  "tail",
		Usage: "print row changes as canonical JSON envelopes, one per line",
		Action: func(*cli.Context) error {
			return errors.New("tail: not built yet")
		},
	}
}
