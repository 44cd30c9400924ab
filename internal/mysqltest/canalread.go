package mysqltest

import (
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/canal"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

// CanalReadRate is issue 19's "go-mysql canal + encoding/json per row"
// reader: go-mysql's canal package from the GTID from (no dump), with a
// handler that puts every row image of db's tables in a map by column
// name and marshals it with encoding/json, the loop a team writes on
// canal. It returns changes per second from start to the want'th change,
// for benchmarks to compare cdcout's readers against in the same run, and
// the steady rate: from the first rows event handled on, without the
// start and connection.
func (s *Server) CanalReadRate(b testing.TB, db, from string, want int) (rate, steady float64) {
	b.Helper()
	cfg := canal.NewDefaultConfig()
	cfg.Addr = s.Host + ":" + strconv.Itoa(s.Port)
	cfg.User, cfg.Password = s.User, s.Password
	cfg.Flavor = s.GoMySQLFlavor()
	cfg.ServerID = ReaderServerID()
	cfg.Dump.ExecutionPath = ""
	cfg.IncludeTableRegex = []string{db + `\..*`}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	gset, err := gomysql.ParseGTIDSet(cfg.Flavor, from)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	c, err := canal.NewCanal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	h := &jsonRowHandler{want: want, done: make(chan struct{})}
	c.SetEventHandler(h)
	ran := make(chan error, 1)
	go func() { ran <- c.StartFromGTID(gset) }()
	select {
	case <-h.done:
	case err := <-ran:
		b.Fatalf("canal stopped after %d changes: %v", h.n, err)
	case <-time.After(10 * time.Minute):
		b.Fatalf("canal read %d of %d changes in 10 minutes", h.n, want)
	}
	end := time.Now()
	c.Close()
	if h.err != nil {
		b.Fatal(h.err)
	}
	return float64(want) / end.Sub(t0).Seconds(), float64(want-h.firstN) / end.Sub(h.first).Seconds()
}

type jsonRowHandler struct {
	canal.DummyEventHandler
	want, n int
	first   time.Time // when the first rows event was handled
	firstN  int       // the changes it held
	err     error     // the first marshal error
	done    chan struct{}
}

func (h *jsonRowHandler) OnRow(e *canal.RowsEvent) error {
	if h.n >= h.want {
		return nil
	}
	for _, row := range e.Rows {
		m := make(map[string]any, len(e.Table.Columns))
		for i, col := range e.Table.Columns {
			if i < len(row) {
				m[col.Name] = row[i]
			}
		}
		if _, err := json.Marshal(m); err != nil && h.err == nil {
			h.err = err
		}
	}
	if e.Action == canal.UpdateAction {
		h.n += len(e.Rows) / 2 // before and after image per change
	} else {
		h.n += len(e.Rows)
	}
	if h.first.IsZero() {
		h.first, h.firstN = time.Now(), h.n
	}
	if h.n >= h.want {
		close(h.done)
	}
	return nil
}
