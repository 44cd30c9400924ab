package binlog

import (
	"context"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/cdcout/cdcout/canonical"
)

// XA transactions (two-phase commit) reach the binlog in two event groups:
// XA START … XA END, XA PREPARE with the rows, and later a group of its own
// with XA COMMIT or XA ROLLBACK. The rows must reach consumers only with the
// COMMIT, and never after a ROLLBACK, so the reader holds a prepared
// transaction's changes in memory until its outcome arrives.
//
// While a prepared transaction is held, every Commit carries the position
// before it: a restart re-reads the PREPARE (and holds its rows again), and
// the transactions after it collapse onto their claims. An XA COMMIT whose
// PREPARE lies before the stream's start cannot be captured; it is logged
// as an error. One-phase XA (XA COMMIT … ONE PHASE) is logged by MariaDB as
// a plain transaction, and by MySQL within its own group, handled here.
//
// MariaDB marks the groups in the GTID event's flags; MySQL writes an
// "XA START" query.
const (
	mariaFlagStandalone  = 1   // FL_STANDALONE: no COMMIT or XID ends the group
	mariaFlagPreparedXA  = 64  // FL_PREPARED_XA: the group is an XA PREPARE
	mariaFlagCompletedXA = 128 // FL_COMPLETED_XA: the group is XA COMMIT/ROLLBACK
)

// xaWarnEvery is how often a transaction still prepared is reported.
const xaWarnEvery = 5 * time.Minute

// heldXA is a prepared XA transaction waiting for its outcome.
type heldXA struct {
	xid      string
	gtid     string
	before   Position // the checkpoint position before its PREPARE
	changes  []*canonical.Change
	since    time.Time
	lastWarn time.Time
}

// startXA marks the transaction being read as an XA transaction: its
// changes are held, not emitted.
func (r *reader) startXA() {
	if r.tx.xa {
		return
	}
	r.tx.xa = true
	r.tx.xaBefore = r.s.positionOf(r.resume.gset, r.resume.file, r.resume.pos)
}

// xidOf returns the xid of an XA statement: what follows the verb, as the
// server writes it (X'<gtrid hex>',X'<bqual hex>',<format id>).
func xidOf(q, verb string) string {
	x := strings.TrimSpace(strings.TrimPrefix(q, verb))
	x = strings.TrimSuffix(x, " ONE PHASE")
	return strings.TrimSpace(x)
}

// xaQuery handles the XA statements of a query event; handled is false for
// any other statement.
func (r *reader) xaQuery(ctx context.Context, q string, commit func() error) (handled bool, err error) {
	switch {
	case strings.HasPrefix(q, "XA START"):
		r.tx.inBegin = true
		r.startXA()
		return true, nil
	case strings.HasPrefix(q, "XA END"):
		if !r.tx.xa {
			return false, nil
		}
		r.tx.xid = xidOf(q, "XA END")
		return true, nil
	case strings.HasPrefix(q, "XA COMMIT"), strings.HasPrefix(q, "XA ROLLBACK"):
		committed := strings.HasPrefix(q, "XA COMMIT")
		if r.tx.xa {
			// One phase, within the transaction's own group.
			held := r.tx.held
			r.tx.held = nil
			if committed {
				if err := r.emitHeld(ctx, held); err != nil {
					return true, err
				}
			}
			return true, commit()
		}
		verb := "XA ROLLBACK"
		if committed {
			verb = "XA COMMIT"
		}
		xid := xidOf(q, verb)
		i := r.findXA(xid)
		if i < 0 {
			if committed {
				r.s.log.Error("XA COMMIT of a transaction prepared before this stream's start position: its rows cannot be captured (start from a position before its XA PREPARE)",
					zap.String("xid", xid), zap.String("gtid", r.tx.gtid), zap.String("file", r.file))
			}
			return true, commit()
		}
		h := r.xa[i]
		r.xa = append(r.xa[:i], r.xa[i+1:]...)
		r.publishXA()
		if committed {
			if err := r.emitHeld(ctx, h.changes); err != nil {
				return true, err
			}
		} else {
			r.s.log.Info("XA transaction rolled back; its rows are not emitted",
				zap.String("xid", xid), zap.String("prepare_gtid", h.gtid), zap.Int("rows", len(h.changes)))
		}
		return true, commit()
	}
	return false, nil
}

// xaPrepared ends an XA transaction's PREPARE group: its changes wait for
// the outcome. Without an xid (no XA END was read) the outcome could not be
// matched, so the changes are emitted with the PREPARE, as a plain
// transaction's would be, and that is logged.
func (r *reader) xaPrepared(ctx context.Context) error {
	if !r.tx.xa {
		return nil
	}
	if r.tx.xid == "" {
		r.s.log.Warn("XA PREPARE without XA END: emitting its rows now, before the transaction's outcome is known",
			zap.String("gtid", r.tx.gtid), zap.String("file", r.file))
		held := r.tx.held
		r.tx.held = nil
		return r.emitHeld(ctx, held)
	}
	now := time.Now()
	r.xa = append(r.xa, heldXA{xid: r.tx.xid, gtid: r.tx.gtid, before: r.tx.xaBefore,
		changes: r.tx.held, since: now, lastWarn: now})
	r.tx.held = nil
	// The group itself emitted nothing.
	r.tx.emitted = 0
	r.publishXA()
	return nil
}

// publishXA makes the held XA transactions visible to PreparedXA.
func (r *reader) publishXA() {
	var since time.Time
	if len(r.xa) > 0 {
		since = r.xa[0].since
	}
	r.s.mu.Lock()
	r.s.xaHeld, r.s.xaSince = len(r.xa), since
	r.s.mu.Unlock()
}

func (r *reader) findXA(xid string) int {
	for i := range r.xa {
		if r.xa[i].xid == xid {
			return i
		}
	}
	return -1
}

// emitHeld hands a committed XA transaction's changes to the handler.
func (r *reader) emitHeld(ctx context.Context, changes []*canonical.Change) error {
	for _, ch := range changes {
		r.tx.emitted++
		if err := r.h(ctx, Event{Change: ch}); err != nil {
			return &handlerError{err}
		}
	}
	return nil
}

// checkpointPos is the position a Commit carries: the current one, or the
// one before the oldest XA transaction still prepared. Such a transaction
// is reported every xaWarnEvery, since the checkpoint cannot pass it.
func (r *reader) checkpointPos() Position {
	if len(r.xa) == 0 {
		return r.s.positionOf(r.resume.gset, r.resume.file, r.resume.pos)
	}
	now := time.Now()
	for i := range r.xa {
		h := &r.xa[i]
		if now.Sub(h.lastWarn) >= xaWarnEvery {
			h.lastWarn = now
			r.s.log.Warn("XA transaction prepared but neither committed nor rolled back; the checkpoint stays before it and its rows are held in memory",
				zap.String("xid", h.xid), zap.String("prepare_gtid", h.gtid), zap.Duration("prepared_for", now.Sub(h.since)), zap.Int("rows", len(h.changes)))
		}
	}
	return r.xa[0].before
}
