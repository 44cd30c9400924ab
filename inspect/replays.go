package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/control"
	"github.com/cdcout/cdcout/replay"
)

// ReplayError is a replay request that cannot be carried out as asked
// (a range that does not parse, or one that starts before what the
// outbox holds): the caller's to fix.
type ReplayError struct {
	Msg string
	// Invalid: the request itself is malformed (400), not refused (409).
	Invalid bool
}

func (e *ReplayError) Error() string { return e.Msg }

// replaysShown is how many finished replays status and /v1/sinks list.
const replaysShown = 5

// StartReplay records a replay of sink over from..to (to may be "") asked
// by by, after checking the sink and the range; extra are sink names known besides the
// fleet's and the outbox's.
func (r Reader) StartReplay(ctx context.Context, sink, from, to, by string, extra ...string) (replay.Status, error) {
	var st replay.Status
	known, err := r.KnownSinks(ctx, extra...)
	if err != nil {
		return st, err
	}
	if !slices.Contains(known, sink) {
		return st, &ErrUnknownSink{Sink: sink, Instance: r.Instance, Known: known}
	}
	rng, err := replay.ParseRange(from, to)
	if err != nil {
		return st, &ReplayError{Msg: err.Error(), Invalid: true}
	}
	all, err := r.store().PipesWithRecords(ctx, r.pipePrefix(), "")
	if err != nil {
		return st, err
	}
	// A pipe retention emptied has no records but a mark: its part of
	// the range is re-read from the binlog (engine/replay_binlog.go).
	marks, err := r.store().RetentionMarks(ctx, r.pipePrefix())
	if err != nil {
		return st, err
	}
	for p := range marks {
		if !slices.Contains(all, p) {
			all = append(all, p)
		}
	}
	slices.Sort(all)
	var pipes []string
	for _, p := range all {
		if _, s := splitPipe(r.Instance, p); s == sink {
			pipes = append(pipes, p)
		}
	}
	if len(pipes) == 0 {
		return st, &ReplayError{Msg: fmt.Sprintf("sink %s of instance %s has no records in the outbox to replay, and retention deleted none", sink, r.Instance)}
	}
	maxID, err := r.store().NewestRecordID(ctx, pipes)
	if err != nil {
		return st, err
	}
	id, err := replay.Start(ctx, r.DB, r.Schema, r.Instance, sink, rng, pipes, maxID, by)
	if errors.Is(err, replay.ErrRunning) {
		return st, &ReplayError{Msg: fmt.Sprintf("sink %s: %v", sink, err)}
	}
	if err != nil {
		return st, err
	}
	return replay.Status{ID: id, Sink: sink, From: rng.From.Text, To: rng.To.Text, Status: replay.Running}, nil
}

// Replays lists the instance's running replays and its latest finished
// ones; a running replay of a paused sink says it waits.
func (r Reader) Replays(ctx context.Context) ([]replay.Status, error) {
	list, err := replay.List(ctx, r.DB, r.Schema, r.Instance, replaysShown)
	if err != nil || len(list) == 0 {
		return list, err
	}
	paused, err := control.Paused(ctx, r.DB, r.Schema, r.Instance)
	if err != nil {
		return nil, err
	}
	for i := range list {
		if list[i].Status == replay.Running && paused[list[i].Sink] {
			list[i].Waiting = "the sink is paused: the replay goes on once it is resumed"
		}
	}
	return list, nil
}

// replayRequest is the body of POST /v1/sinks/{name}/replay.
type replayRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func (s *Server) replayRoutes() {
	s.Admin("POST /v1/sinks/{name}/replay", s.startReplay)
}

func (s *Server) startReplay(w http.ResponseWriter, r *http.Request) {
	sink := r.PathValue("name")
	var req replayRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 4096))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		s.writeJSON(w, http.StatusBadRequest, map[string]string{"error": `want a JSON body {"from": "GTID|file:pos|RFC 3339 time", "to": "…" (optional)}`})
		return
	}
	st, err := s.reader.StartReplay(r.Context(), sink, req.From, req.To, "api", s.deps.Sinks...)
	var (
		unknown *ErrUnknownSink
		bad     *ReplayError
	)
	switch {
	case errors.As(err, &unknown):
		s.writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		return
	case errors.As(err, &bad) && bad.Invalid:
		s.writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	case errors.As(err, &bad):
		s.writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	case err != nil:
		s.reply(w, nil, err)
		return
	}
	s.forgetPipes()
	s.log.Info("sink replay asked for over the admin API", zap.String("sink", sink), zap.Int64("replay", st.ID),
		zap.String("from", st.From), zap.String("to", st.To))
	s.writeJSON(w, http.StatusAccepted, st)
}
