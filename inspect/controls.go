package inspect

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/control"
)

// markPaused sets Paused on the pipes of paused sinks.
func (r Reader) markPaused(ctx context.Context, byPipe map[string]*PipeStatus) error {
	paused, err := control.Paused(ctx, r.DB, r.Schema, r.Instance)
	if err != nil {
		return err
	}
	for _, p := range byPipe {
		p.Paused = paused[p.Sink]
	}
	return nil
}

// KnownSinks lists the sinks of the instance anyone knows of: those the
// fleet's replicas deliver to (their fleet rows, stale ones included) and
// those with records in the outbox, plus extra (this replica's own).
func (r Reader) KnownSinks(ctx context.Context, extra ...string) ([]string, error) {
	set := map[string]bool{}
	for _, s := range extra {
		set[s] = true
	}
	f, err := r.Fleet(ctx)
	if err != nil {
		return nil, err
	}
	for _, rep := range f.Replicas {
		for _, s := range rep.Payload.Sinks {
			set[s.Name] = true
		}
	}
	pipes, err := r.store().PipesWithRecords(ctx, r.pipePrefix(), "")
	if err != nil {
		return nil, err
	}
	for _, pipe := range pipes {
		if _, sink := splitPipe(r.Instance, pipe); sink != "" {
			set[sink] = true
		}
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	slices.Sort(out)
	return out, nil
}

// ErrUnknownSink is returned by SetPaused for a sink no replica or record
// of the instance knows.
type ErrUnknownSink struct {
	Sink, Instance string
	Known          []string
}

func (e *ErrUnknownSink) Error() string {
	known := "none"
	if len(e.Known) > 0 {
		known = strings.Join(e.Known, ", ")
	}
	return fmt.Sprintf("instance %s has no sink %q (known sinks: %s)", e.Instance, e.Sink, known)
}

// SetPaused pauses or resumes a sink of the instance after checking that
// the sink exists (a typo must not pause nothing and report success);
// extra are sink names known besides the fleet's and the outbox's. It
// reports whether the state changed.
func (r Reader) SetPaused(ctx context.Context, sink string, paused bool, by string, extra ...string) (bool, error) {
	known, err := r.KnownSinks(ctx, extra...)
	if err != nil {
		return false, err
	}
	if !slices.Contains(known, sink) {
		return false, &ErrUnknownSink{Sink: sink, Instance: r.Instance, Known: known}
	}
	return control.SetPaused(ctx, r.DB, r.Schema, r.Instance, sink, paused, by)
}

// sinkControlView is the answer of the pause and resume endpoints.
type sinkControlView struct {
	Instance string `json:"instance"`
	Sink     string `json:"sink"`
	Paused   bool   `json:"paused"`
	// Changed is false when the sink already was in that state.
	Changed bool `json:"changed"`
}

func (s *Server) controlRoutes() {
	s.Admin("POST /v1/sinks/{name}/pause", func(w http.ResponseWriter, r *http.Request) { s.setPaused(w, r, true) })
	s.Admin("POST /v1/sinks/{name}/resume", func(w http.ResponseWriter, r *http.Request) { s.setPaused(w, r, false) })
}

func (s *Server) setPaused(w http.ResponseWriter, r *http.Request, paused bool) {
	sink := r.PathValue("name")
	changed, err := s.reader.SetPaused(r.Context(), sink, paused, "api", s.deps.Sinks...)
	var unknown *ErrUnknownSink
	switch {
	case errors.As(err, &unknown):
		s.writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		return
	case err != nil:
		s.reply(w, nil, err)
		return
	}
	s.forgetPipes()
	s.log.Info("sink control changed over the admin API", zap.String("sink", sink), zap.Bool("paused", paused), zap.Bool("changed", changed))
	s.writeJSON(w, http.StatusOK, sinkControlView{Instance: s.deps.Instance, Sink: sink, Paused: paused, Changed: changed})
}
