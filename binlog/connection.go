package binlog

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// syncerConfig is the go-mysql syncer configuration of one session of the
// stream's connection.
func (s *Stream) syncerConfig() (replication.BinlogSyncerConfig, error) {
	host, portStr, err := net.SplitHostPort(s.dsn.Addr)
	var port uint64
	if err == nil {
		port, err = strconv.ParseUint(portStr, 10, 16)
	}
	if s.dsn.Net == "unix" {
		host, port, err = s.dsn.Addr, 0, nil
	}
	if err != nil {
		return replication.BinlogSyncerConfig{}, fmt.Errorf("address %q: %w", s.dsn.Addr, err)
	}
	tlsConfig := s.dsn.TLS
	if s.plaintext {
		tlsConfig = nil
	}
	return replication.BinlogSyncerConfig{
		ServerID:                s.cfg.ServerID,
		Flavor:                  s.info.Flavor,
		Host:                    host,
		Port:                    uint16(port),
		User:                    s.dsn.User,
		Password:                s.dsn.Passwd,
		TLSConfig:               tlsConfig,
		ParseTime:               false,
		UseDecimal:              false,
		TimestampStringLocation: time.UTC,
		HeartbeatPeriod:         s.cfg.HeartbeatPeriod,
		ReadTimeout:             s.cfg.ReadTimeout,
		// Reconnects are ours: go-mysql's resume point may be inside a
		// transaction, ours is always the last commit.
		DisableRetrySync: true,
		DiscardGTIDSet:   true,
		// go-mysql buffers this many decoded events ahead of the reader;
		// its default (10,240) costs ~160 MB inside a huge transaction's
		// large row events. A small queue keeps memory bounded (docs/ARCHITECTURE.md,
		// invariant 6) and costs no throughput: the reader is the
		// bottleneck either way.
		EventCacheCount:     128,
		Logger:              goMySQLLogger(s.log.Named("go-mysql")),
		RowsEventDecodeFunc: s.decodeRowsEvent,
	}, nil
}

// handlerError marks the handler's own error so Run returns it unchanged.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }

// permanentError is an error no reconnect can fix (schema, purged binlog).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }

func (e *permanentError) Unwrap() error { return e.err }

// session runs one connection until it fails.
func (r *reader) session(ctx context.Context, scfg replication.BinlogSyncerConfig) (err error) {
	syncer := replication.NewBinlogSyncer(scfg)
	defer func() {
		r.s.setUp(false, err)
		// Closing kills the server's dump thread over a new connection,
		// which on a dead link blocks for a read timeout: it must not
		// delay the reconnect.
		r.s.closing.Add(1)
		go func() {
			defer r.s.closing.Done()
			syncer.Close()
		}()
	}()
	var streamer *replication.BinlogStreamer
	sp := r.resume
	if sp.gset != nil && (sp.useGTID || sp.file == "") {
		streamer, err = syncer.StartSyncGTID(sp.gset.Clone())
	} else {
		streamer, err = syncer.StartSync(gomysql.Position{Name: sp.file, Pos: sp.pos})
	}
	if err != nil {
		return r.classify(err)
	}
	r.file = sp.file
	r.tx = txState{}
	r.s.touch()
	r.s.setUp(true, nil)
	for {
		ev, err := streamer.GetEvent(ctx)
		if err != nil {
			return r.classify(err)
		}
		r.s.touch()
		if err := r.event(ctx, ev, ev.Header); err != nil {
			return err
		}
	}
}

// classify turns server-side refusals into permanent errors.
func (r *reader) classify(err error) error {
	if err == nil {
		return err
	}
	if isFatalReadError(err) {
		if isPurgedError(err) {
			return &permanentError{purgedError(r.resume.String(), "see SHOW BINARY LOGS", r.s.cfg.Resume != nil)}
		}
		return &permanentError{fmt.Errorf("server refused to send the binlog from %s: %w", r.resume.String(), err)}
	}
	return err
}
