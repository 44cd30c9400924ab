package command

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/cdcout/cdcout/fleet"
	"github.com/cdcout/cdcout/inspect"
	"github.com/cdcout/cdcout/replay"
)

// stateDBFlags are the flags that locate the state database; deadStateDB
// reads them.
func stateDBFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "dsn", EnvVars: []string{"CDCOUT_DSN"}, Usage: "source database DSN (the state database's too unless --state-dsn)"},
		&cli.StringFlag{Name: "state-dsn", EnvVars: []string{"CDCOUT_STATE_DSN"}, Usage: "state database DSN (default: --dsn)"},
		&cli.StringFlag{Name: "state-db", EnvVars: []string{"CDCOUT_STATE_DB"}, Value: "cdcout", Usage: "state database name"},
	}
}

// statusCommand prints what /v1/sinks, /v1/leases and /v1/fleet show, plus
// the checkpoint, read straight from the state database, so it works when
// no replica (or no HTTP server) is running.
func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "show pipes, leases, fleet and checkpoint of an instance from the state database",
		Flags: append(stateDBFlags(),
			&cli.StringFlag{Name: "instance", EnvVars: []string{"CDCOUT_INSTANCE"}, Value: "default", Usage: "instance whose pipes and leases to show"},
			&cli.DurationFlag{Name: "stale-after", Value: fleet.DefaultStaleAfter, Usage: "fleet rows older than this are reported stale"},
			&cli.BoolFlag{Name: "json", Usage: "print one JSON object"},
		),
		Action: func(c *cli.Context) error {
			db, schema, err := deadStateDB(c)
			if err != nil {
				return err
			}
			defer db.Close()
			r := inspect.Reader{DB: db, Schema: schema, Instance: c.String("instance"), StaleAfter: c.Duration("stale-after")}
			st, err := r.Status(c.Context)
			if err != nil {
				return fmt.Errorf("read status: %w", err)
			}
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			return writeStatus(c.App.Writer, st)
		},
	}
}

func writeStatus(w io.Writer, st inspect.Status) error {
	fmt.Fprintf(w, "instance %s\n", st.Instance)
	if cp := st.Checkpoint; cp != nil {
		fmt.Fprintf(w, "checkpoint %s  epoch %d  holder %s  updated %s ago\n",
			compactJSON(cp.Position), cp.Epoch, cp.Holder, ago(cp.AgeSeconds))
	} else {
		fmt.Fprintln(w, "checkpoint none yet")
	}
	writeRunway(w, st.BinlogRunway)

	tw := newSection(w, "PIPES", len(st.Pipes), "  PIPE\tPENDING\tDELIVERING\tDELIVERED\tDEAD\tOLDEST PENDING\tDELIVERY LAG\tDRAIN HOLDER\tLAST ERROR")
	for _, p := range st.Pipes {
		lastErr := ""
		if p.LastError != "" {
			lastErr = oneLine(p.LastError, 60)
			if p.LastErrorAt != nil {
				lastErr += " (" + p.LastErrorAt.UTC().Format(time.RFC3339) + ")"
			}
		}
		name := p.Pipe
		if p.Paused {
			name += " (paused)"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", name, p.Pending, p.Delivering, p.Delivered, p.Dead,
			ago(p.OldestPendingAgeSeconds), ago(p.DeliveryLagSeconds), dash(p.DrainHolder), lastErr)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if err := writeReplays(w, st.Replays); err != nil {
		return err
	}

	tw = newSection(w, "LEASES", len(st.Leases), "  NAME\tHOLDER\tEPOCH\tSTATE")
	for _, l := range st.Leases {
		state := "expired"
		if l.Live {
			state = "live, expires in " + ago(l.ExpiresInSeconds)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", l.Name, dash(l.Holder), l.Epoch, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	f := st.Fleet
	fmt.Fprintf(w, "\nFLEET %d/%d responded", f.Responded, f.Expected)
	if len(f.Missing) > 0 {
		fmt.Fprintf(w, "; missing: %s", strings.Join(f.Missing, ", "))
	}
	if len(f.Stale) > 0 {
		var parts []string
		for _, s := range f.Stale {
			parts = append(parts, s.ReplicaID+" ("+ago(s.AgeSeconds)+" old)")
		}
		fmt.Fprintf(w, "; stale: %s", strings.Join(parts, ", "))
	}
	if f.Versions != nil {
		var parts []string
		for v, n := range f.Versions {
			parts = append(parts, v+"×"+strconv.Itoa(n))
		}
		sort.Strings(parts)
		fmt.Fprintf(w, "; mixed versions: %s", strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(f.Replicas) > 0 {
		fmt.Fprintln(tw, "  REPLICA\tVERSION\tROLE\tSEGMENT FORMAT\tWRITTEN\tREACHABLE AT")
		for _, r := range f.Replicas {
			written := ago(r.AgeSeconds) + " ago"
			if r.Stale {
				written += " (stale)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", r.ReplicaID, dash(r.Version), dash(r.Payload.Role), segmentFormats(r.Payload), written, dash(r.ReachableAt))
		}
	}
	return tw.Flush()
}

// segmentFormats is what a replica's fleet row says of outbox segment
// formats: the newest it reads (1 from a release that does not say) and
// the one it writes, when it says (segment_format auto holds at 1 while
// any replica reads only 1).
func segmentFormats(info inspect.EngineInfo) string {
	s := "reads " + strconv.Itoa(max(info.ReadsSegmentFormat, 1))
	if info.SegmentFormat > 0 {
		s += ", writes " + strconv.Itoa(info.SegmentFormat)
	}
	return s
}

// ago renders seconds compactly: "850ms", "12.3s", "4m05s", "2h10m".
func ago(sec float64) string {
	if sec <= 0 {
		return "0s"
	}
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func compactJSON(b []byte) string {
	return strings.Join(strings.Fields(string(b)), "")
}

// writeRunway prints the leader's binlog runway reading, if there is one.
func writeRunway(w io.Writer, r *inspect.RunwayView) {
	switch {
	case r == nil || r.Runway == nil:
	case r.Seconds == nil:
		fmt.Fprintf(w, "binlog runway unlimited: the server never purges %s (%s)\n", r.File, r.Limit)
	default:
		fmt.Fprintf(w, "binlog runway %s: the server may purge %s (it holds the checkpoint) from %s (%s)\n",
			(time.Duration(*r.Seconds) * time.Second).String(), r.File, r.PurgeAt.UTC().Format(time.RFC3339), r.Limit)
	}
}

// newSection writes the title of a section of the status and returns the
// table for its rows, begun with header, or with "none" if it has no rows.
func newSection(w io.Writer, title string, rows int, header string) *tabwriter.Writer {
	fmt.Fprintln(w, "\n"+title)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if rows == 0 {
		fmt.Fprintln(tw, "  none")
	} else {
		fmt.Fprintln(tw, header)
	}
	return tw
}

// writeReplays lists the running and latest finished replays, if any.
func writeReplays(w io.Writer, replays []replay.Status) error {
	if len(replays) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nREPLAYS")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tSINK\tRANGE\tSTATE\tDELIVERED\tFAILED\tPIPES DONE\tASKED")
	for _, r := range replays {
		rng := "from " + r.From
		if r.To != "" {
			rng += " to " + r.To
		}
		state := r.Status
		switch {
		case r.Waiting != "":
			state += " (waiting: sink paused)"
		case r.FinishedAt != nil:
			state += " " + r.FinishedAt.UTC().Format(time.RFC3339)
		}
		done := 0
		for _, p := range r.Pipes {
			if p.Status == replay.Done {
				done++
			}
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%d\t%d\t%d/%d\t%s by %s\n", r.ID, r.Sink, rng, state, r.Delivered, r.Failed,
			done, len(r.Pipes), r.RequestedAt.UTC().Format(time.RFC3339), dash(r.RequestedBy))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range replays {
		for _, p := range r.Pipes {
			if p.Status == replay.Failed {
				fmt.Fprintf(w, "  replay %d of %s failed: %s\n", r.ID, p.Pipe, p.LastError)
			}
		}
	}
	return nil
}
