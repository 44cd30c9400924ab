package engine

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/control"
	"github.com/cdcout/cdcout/internal/pause"
	"github.com/cdcout/cdcout/lease"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/replay"
	"github.com/cdcout/cdcout/sink"
)

// Replays (package replay) are carried out by whichever replica holds a
// pipe's drain lease, beside the pipe's drainer: the drainer goes on
// delivering new records, the replay sends the range's delivered records
// again, under their original ids, to this one sink. A replay's pipe
// moves with its drain lease; the new holder goes on from the recorded
// progress, so a record may be sent once more around a takeover (same
// id). A paused sink's replay waits: pause means nothing is delivered to
// the sink.

// replayEvery is how often a replica looks for running replays.
const replayEvery = time.Second

// replayPage bounds the segments one page of a replay reads (up to 1,000
// records each).
const replayPage = 4

// replayer runs the replays of the pipes this replica holds.
type replayer struct {
	db               *sql.DB
	store            *outbox.Store
	schema, instance string
	holder           string
	sinks            map[string]sinkEntry
	paused           *control.Watcher
	held             func(pipe string) (lease.Lease, bool)
	// known tells the drain leases of a replay's pipes: a pipe with
	// nothing pending is otherwise not leased by anyone after a restart.
	known             func(pipes []string)
	log               *zap.Logger
	retryMin, retryMx time.Duration
	// stream is the replica's binlog configuration and routes the sinks'
	// routes, for re-reading what the outbox no longer holds
	// (replay_binlog.go); nil stream: not re-read.
	stream      func() binlog.Config
	routes      []*route
	maxRowBytes int
	rereadMu    sync.Mutex

	mu      sync.Mutex
	running map[string]bool // "<replay id>/<pipe>"
	wg      sync.WaitGroup
}

// run looks for work every replayEvery until ctx ends, then waits for
// the pipe replays it started.
func (rp *replayer) run(ctx context.Context) {
	defer rp.wg.Wait()
	t := time.NewTicker(replayEvery)
	defer t.Stop()
	failing := false
	for {
		err := rp.scan(ctx)
		if err != nil && !failing && ctx.Err() == nil {
			rp.log.Warn("read running replays", zap.Error(err))
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (rp *replayer) scan(ctx context.Context) error {
	active, err := replay.Active(ctx, rp.db, rp.schema, rp.instance)
	if err != nil {
		return err
	}
	for _, st := range active {
		se, ok := rp.sinks[st.Sink]
		if !ok || rp.paused.IsPaused(st.Sink) {
			continue // a replica that has the sink does it; a paused one waits
		}
		rng, err := replay.ParseRange(st.From, st.To)
		if err != nil {
			rp.log.Error("replay with a range that does not parse", zap.Int64("replay", st.ID), zap.Error(err))
			continue
		}
		for _, p := range st.Pipes {
			if p.Status != replay.Running {
				continue
			}
			rp.known([]string{p.Pipe})
			if _, held := rp.held(p.Pipe); !held {
				continue
			}
			key := strconv.FormatInt(st.ID, 10) + "/" + p.Pipe
			rp.mu.Lock()
			busy := rp.running[key]
			rp.running[key] = true
			rp.mu.Unlock()
			if busy {
				continue
			}
			rp.wg.Add(1)
			go func() {
				defer rp.wg.Done()
				defer func() { rp.mu.Lock(); delete(rp.running, key); rp.mu.Unlock() }()
				rp.replayPipe(ctx, st, rng, p, se)
			}()
		}
	}
	return nil
}

// replayPipe re-delivers one pipe's part of a replay from its recorded
// progress, page by page, while this replica holds the pipe and the sink
// is not paused.
func (rp *replayer) replayPipe(ctx context.Context, st replay.Status, rng replay.Range, p replay.PipeProgress, se sinkEntry) {
	log := rp.log.With(zap.Int64("replay", st.ID), zap.String("pipe", p.Pipe))
	log.Info("replay of the pipe starts", zap.String("from", st.From), zap.String("to", st.To), zap.String("after", p.LastID))
	after := p.LastID
	mine := func() bool {
		_, held := rp.held(p.Pipe)
		return held && !rp.paused.IsPaused(st.Sink) && ctx.Err() == nil
	}
	need, heldAt, heldOK, mark, err := rp.needsReread(ctx, rng, p)
	if err != nil {
		log.Warn("look up what the outbox holds for the replay", zap.Error(err))
		return
	}
	if need {
		if !rp.reread(ctx, log, st, rng, p, se, heldAt, heldOK, mark, mine) {
			return
		}
		after = mark
	}
	for mine() {
		page, err := rp.store.DeliveredAfter(ctx, p.Pipe, st.Sink, after, st.MaxID, replayPage)
		if err != nil {
			log.Warn("read records to replay", zap.Error(err))
			_ = pause.For(ctx, time.Second)
			continue
		}
		var recs []outbox.Record
		end := page.Done
		for _, rec := range page.Records {
			w := replay.Where{CommitTime: rec.CommitTime}
			if rng.From.Kind != replay.KindTime {
				if w, err = replay.WhereOf(rec.Payload, rec.CommitTime); err != nil {
					log.Warn("record without a readable source: not replayed", zap.String("id", rec.ID), zap.Error(err))
					continue
				}
			}
			if rng.After(w) {
				end = true // ids are in commit order: nothing later is in range
				break
			}
			if rng.Contains(w) {
				recs = append(recs, rec)
			}
		}
		if !rp.deliverInOrder(ctx, log, st, p.Pipe, se, recs, mine, true) {
			return // progress is recorded up to what went out
		}
		if page.Next != "" {
			after = page.Next
			if err := replay.Progress(ctx, rp.db, rp.schema, st.ID, p.Pipe, after, 0, 0, "", rp.holder); err != nil {
				log.Warn("record replay progress", zap.Error(err))
			}
		}
		if end {
			if err := replay.FinishPipe(ctx, rp.db, rp.schema, st.ID, p.Pipe, rp.holder); err != nil {
				log.Warn("finish replay of the pipe", zap.Error(err))
				return
			}
			log.Info("replay of the pipe done")
			return
		}
	}
}

// deliverInOrder sends recs (in id order) in calls of distinct row keys,
// each call after the one before is through, so a key's records arrive
// in commit order. A record the sink refuses for good is counted as
// failed and not retried; any other error is retried with backoff. It
// reports false when it stopped because the pipe is no longer its to
// replay. byID: the progress moves to the records' ids (outbox records;
// a re-read's derived ids say nothing of where the outbox part is).
func (rp *replayer) deliverInOrder(ctx context.Context, log *zap.Logger, st replay.Status, pipe string, se sinkEntry, recs []outbox.Record, mine func() bool, byID bool) bool {
	batch := max(se.cfg.BatchSize, 1)
	for len(recs) > 0 {
		keys := map[string]bool{}
		n := 0
		for n < len(recs) && n < batch && !keys[recs[n].Key] {
			keys[recs[n].Key] = true
			n++
		}
		call := recs[:n]
		var failed int64
		lastErr, refused := "", ""
		for wait := rp.retryMin; len(call) > 0; wait = min(2*wait, rp.retryMx) {
			if !mine() {
				return false
			}
			cctx, cancel := context.WithTimeout(ctx, se.cfg.Timeout)
			errs := se.sink.Deliver(cctx, call)
			cancel()
			var again []outbox.Record
			for i, err := range errs {
				switch {
				case err == nil:
				case sink.IsPermanent(err):
					failed++
					refused = err.Error()
					log.Warn("replayed record refused by the sink; not retried", zap.String("id", call[i].ID), zap.Error(err))
				default:
					again = append(again, call[i])
					lastErr = err.Error()
				}
			}
			if call = again; len(call) > 0 {
				_ = replay.Progress(ctx, rp.db, rp.schema, st.ID, pipe, "", 0, 0, lastErr, rp.holder)
				_ = pause.For(ctx, wait)
			}
		}
		last := ""
		if byID {
			last = recs[n-1].ID
		}
		if err := replay.Progress(ctx, rp.db, rp.schema, st.ID, pipe, last, int64(n)-failed, failed, refused, rp.holder); err != nil {
			log.Warn("record replay progress", zap.Error(err))
		}
		recs = recs[n:]
	}
	return true
}
