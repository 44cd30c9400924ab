package binlog

import (
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/canal"
	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

// canalReadRate is issue 19's "go-mysql canal + encoding/json per row"
// reader: go-mysql's canal package from the GTID from (no dump), with a
// handler that puts every row image of db's tables in a map by column
// name and marshals it with encoding/json, the loop a team writes on
// canal. It returns changes per second, from start to the want'th change.
func canalReadRate(b *testing.B, srv *mysqltest.Server, db, from string, want int) float64 {
	b.Helper()
	cfg := canal.NewDefaultConfig()
	cfg.Addr = srv.Host + ":" + strconv.Itoa(srv.Port)
	cfg.User, cfg.Password = srv.User, srv.Password
	cfg.Flavor = srv.GoMySQLFlavor()
	cfg.ServerID = mysqltest.ReaderServerID()
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
	rate := float64(want) / time.Since(t0).Seconds()
	c.Close()
	if h.err != nil {
		b.Fatal(h.err)
	}
	return rate
}

type jsonRowHandler struct {
	canal.DummyEventHandler
	want, n int
	err     error // the first marshal error
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
	if h.n >= h.want {
		close(h.done)
	}
	return nil
}
