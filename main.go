// Command cdcout streams MySQL/MariaDB row changes to webhooks, Kafka, NATS
// and files. See README.md.
package main

import (
	"os"

	"github.com/cdcout/cdcout/command"
	"github.com/cdcout/cdcout/internal/gctune"
)

func main() {
	gctune.Apply()
	os.Exit(command.Main(os.Args, os.Stdin, os.Stdout, os.Stderr))
}
