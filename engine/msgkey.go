package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/binlog"
	"github.com/cdcout/cdcout/canonical"
	"github.com/cdcout/cdcout/config"
	"github.com/cdcout/cdcout/format"
	"github.com/cdcout/cdcout/outbox"
	"github.com/cdcout/cdcout/sink"
	"github.com/cdcout/cdcout/sink/kafkasink"
	"github.com/cdcout/cdcout/sink/natssink"
	"github.com/cdcout/cdcout/sink/pubsubsink"
	"github.com/cdcout/cdcout/sink/redissink"
)

// Message keys (key:) and column templates ({col:NAME}) are read from the
// stored envelope at delivery, after the sink's column transforms: a
// hashed key column keys by its hash. The outbox itself stays keyed by
// the row key — lanes, per-key order and a pipe's claims do not change —
// so records of one row keep their commit order, while two rows sharing
// a message key may be delivered in either order relative to each other.

// keyedSink gives the row records it delivers the sink's message key in
// place of the row key (Record.Key is what the broker sinks partition,
// order and label by). A row without one of the key's columns is
// dead-lettered with the reason; it never goes out under another key.
type keyedSink struct {
	outbox.Sink
	cols []string
}

func (k keyedSink) Deliver(ctx context.Context, recs []outbox.Record) []error {
	errs := make([]error, len(recs))
	out := make([]outbox.Record, 0, len(recs))
	at := make([]int, 0, len(recs))
	for i, rec := range recs {
		switch rec.Op {
		case canonical.OpCreate, canonical.OpUpdate, canonical.OpDelete, canonical.OpRead:
			key, err := format.MessageKey(rec, k.cols)
			if err != nil {
				errs[i] = sink.Permanent(err)
				continue
			}
			rec.Key = key
		}
		// Heartbeats and transaction records have no row: they keep theirs.
		out = append(out, rec)
		at = append(at, i)
	}
	if len(out) == 0 {
		return errs
	}
	for j, err := range k.Sink.Deliver(ctx, out) {
		errs[at[j]] = err
	}
	return errs
}

// templateOf is the name template of a broker sink's URL (its default
// when the URL has none), "" for sinks without one.
func templateOf(sc config.Sink) (string, error) {
	scheme, _, _ := strings.Cut(sc.URL, ":")
	switch strings.ToLower(scheme) {
	case "kafka":
		_, t, err := kafkasink.ParseURL(sc.URL)
		return cmpOr(t, kafkasink.DefaultTopicTemplate), err
	case "nats":
		_, t, err := natssink.ParseURL(sc.URL)
		return cmpOr(t, natssink.DefaultSubjectTemplate), err
	case "redis", "rediss":
		o, err := redissink.ParseURL(sc.URL)
		return cmpOr(o.StreamTemplate, redissink.DefaultStreamTemplate), err
	case "pubsub":
		o, err := pubsubsink.ParseURL(sc.URL)
		return cmpOr(o.TopicTemplate, pubsubsink.DefaultTopicTemplate), err
	}
	return "", nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// rowColumns are the columns sink sc needs in every row: its key: and its
// template's {col:…}. A template that does not compile is an error.
func rowColumns(sc config.Sink) (key, tmpl []string, err error) {
	t, err := templateOf(sc)
	if err != nil || t == "" {
		return sc.Key, nil, err
	}
	pt, err := format.ParseTemplate(t)
	if err != nil {
		return nil, nil, err
	}
	if len(pt.Columns()) > 0 && (sc.Transactions || sc.Heartbeat > 0) {
		return nil, nil, fmt.Errorf("template %q names row columns, but heartbeat and transactions records have no row", t)
	}
	return sc.Key, pt.Columns(), nil
}

// sinkRowColumns are the row columns one sink needs (rowColumns), kept
// by New: Run must not read the configuration, which the caller may
// share with another engine.
type sinkRowColumns struct {
	name      string
	tables    config.TableFilter
	key, tmpl []string
}

// withMessageKey wraps a sink with a key: in a keyedSink.
func withMessageKey(sc config.Sink, s outbox.Sink) outbox.Sink {
	if len(sc.Key) == 0 {
		return s
	}
	return keyedSink{Sink: s, cols: slices.Clone(sc.Key)}
}

// checkRowColumns refuses to start when a sink's key: or {col:…} names a
// column that a table it takes does not have, as the source's
// information_schema describes the tables now (a table created later is
// checked per row at delivery). A source that does not answer is only
// logged: the per-row check still dead-letters what cannot be routed.
func (e *Engine) checkRowColumns(ctx context.Context) error {
	need := false
	for _, sc := range e.rowCols {
		need = need || len(sc.key)+len(sc.tmpl) > 0
	}
	if !need {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tables, err := binlog.TableColumns(cctx, e.cfg.DSN.Value())
	if err != nil {
		e.log.Warn("read the source's columns to check key: and templates; rows are checked at delivery", zap.Error(err))
		return nil
	}
	var problems []string
	for i, sc := range e.rowCols {
		for _, t := range tables {
			if !sc.tables.Matches(t.DB, t.Table) || !e.captures(t.DB, t.Table) {
				continue
			}
			for _, c := range sc.key {
				if !slices.Contains(t.Columns, c) {
					problems = append(problems, fmt.Sprintf("sinks[%d] (%s).key: column %q is not a column of %s.%s", i, sc.name, c, t.DB, t.Table))
				}
			}
			for _, c := range sc.tmpl {
				if !slices.Contains(t.Columns, c) {
					problems = append(problems, fmt.Sprintf("sinks[%d] (%s).url: template column {col:%s} is not a column of %s.%s", i, sc.name, c, t.DB, t.Table))
				}
			}
		}
	}
	if len(problems) > 0 {
		return &ColumnError{Problems: problems}
	}
	return nil
}

// ColumnError is a start refused because sinks name columns (key:,
// {col:…}) that tables they take do not have: a configuration to fix.
type ColumnError struct {
	Problems []string
}

func (e *ColumnError) Error() string {
	return strings.Join(e.Problems, "; ") + " (narrow the sink's tables or fix the column)"
}

// captures reports whether the top-level tables: lets db.table through.
func (e *Engine) captures(db, table string) bool {
	if len(e.cfg.Tables) == 0 {
		return true
	}
	return config.TableFilter{Include: e.cfg.Tables}.Matches(db, table)
}
