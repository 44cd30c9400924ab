// Package command implements cdcout's command line. It is kept apart from
// main so tests can run every command in-process with their own arguments
// and output streams.
package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/engine"
	"github.com/cdcout/cdcout/internal/buildinfo"
	"github.com/cdcout/cdcout/state"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1 // runtime failure (server unreachable, stream error)
	ExitConfig  = 2 // the configuration or command line is wrong
)

// configError marks errors the user fixes by changing flags or config; they
// exit with ExitConfig.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// ConfigErrorf builds an error that exits with ExitConfig.
func ConfigErrorf(format string, args ...any) error {
	return &configError{err: fmt.Errorf(format, args...)}
}

// NewApp builds the cdcout command tree writing to the given streams.
func NewApp(stdin io.Reader, stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:                 "cdcout",
		Usage:                "stream MySQL/MariaDB row changes to webhooks, Kafka, NATS and files",
		Version:              buildinfo.Version(),
		Reader:               stdin,
		Writer:               stdout,
		ErrWriter:            stderr,
		EnableBashCompletion: false,
		HideVersion:          true,
		Commands: []*cli.Command{
			runCommand(),
			tailCommand(),
			receiveCommand(),
			probeCommand(),
			deadCommand(),
			sinkCommand(),
			statusCommand(),
			fleetCommand(),
			backfillCommand(),
			versionCommand(),
		},
		// Errors are printed once, by Main, as one line.
		ExitErrHandler: func(*cli.Context, error) {},
	}
	// A wrong flag is reported as one line on stderr with where to look,
	// not with the whole usage text on stdout (where it would pollute a
	// pipe such as cdcout tail | jq).
	var wire func(cmds []*cli.Command, path string)
	wire = func(cmds []*cli.Command, path string) {
		for _, c := range cmds {
			name := path + " " + c.Name
			c.OnUsageError = func(_ *cli.Context, err error, _ bool) error {
				return fmt.Errorf("%w (see %s --help)", err, name)
			}
			wire(c.Subcommands, name)
		}
	}
	wire(app.Commands, "cdcout")
	return app
}

// Main runs cdcout with args (args[0] is the program name) and returns the
// process exit code. SIGINT/SIGTERM cancel the context; a second signal
// exits at once.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if _, ok := <-sigs; !ok {
			return
		}
		cancel()
		if _, ok := <-sigs; ok {
			fmt.Fprintln(stderr, "cdcout: second signal, exiting now")
			os.Exit(ExitFailure)
		}
	}()
	return run(ctx, args, stdin, stdout, stderr)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := NewApp(stdin, stdout, stderr).RunContext(ctx, args)
	if err == nil {
		return ExitOK
	}
	err = classify(err)
	fmt.Fprintf(stderr, "cdcout: %s\n", strings.Join(strings.Fields(err.Error()), " "))
	var ce *configError
	if errors.As(err, &ce) || isUsageError(err) {
		return ExitConfig
	}
	return ExitFailure
}

// classify gives an error its exit code and hint by its cause, the same
// for every command (the README's exit-code table): what only a change of
// configuration can fix — a refused login, an unknown database, a server
// that cannot be captured — exits with ExitConfig, whichever command met it.
func classify(err error) error {
	var ce *configError
	if errors.As(err, &ce) {
		return err
	}
	switch {
	case state.Refused(err):
		return &configError{fmt.Errorf("%w (check the user, password and database in the DSN)", err)}
	case errors.Is(err, binlog.ErrServerNotReady):
		return &configError{err}
	}
	var col *engine.ColumnError
	if errors.As(err, &col) {
		return &configError{err}
	}
	return err
}

// scrubbedError is an error whose message was redacted (scrub) but which
// still unwraps to its cause, for classify.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// isUsageError recognises urfave/cli's own complaints about the command line.
func isUsageError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"flag provided but not defined", "Required flag", "invalid value", "No help topic"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print cdcout's version and commit",
		Action: func(c *cli.Context) error {
			fmt.Fprintf(c.App.Writer, "cdcout %s (commit %s)\n", buildinfo.Version(), buildinfo.Commit())
			if why := buildinfo.Why(); why != "" {
				fmt.Fprintf(c.App.ErrWriter, "cdcout: %s\n", why)
			}
			return nil
		},
	}
}
