package logbridge

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/zap"
)

// The go-sql-driver logger is process-wide (mysql.SetLogger), and by
// default it prints raw "[mysql] …" lines to stderr, which break a JSON
// log. It is set once, to a printer that forwards to whichever zap logger
// RouteMySQLDriver named last (a process builds one logger; tests that run
// the command in-process build several).
var (
	driverOnce   sync.Once
	driverTarget atomic.Pointer[zap.Logger]
)

// RouteMySQLDriver sends go-sql-driver/mysql's log lines (bad idle
// connections, broken packets) to logger, at warn: each one is a dropped or
// broken database connection.
func RouteMySQLDriver(logger *zap.Logger) {
	driverTarget.Store(logger)
	driverOnce.Do(func() {
		// SetLogger fails only for a nil logger.
		_ = mysql.SetLogger(driverPrinter{})
	})
}

type driverPrinter struct{}

var _ mysql.Logger = driverPrinter{}

func (driverPrinter) Print(v ...any) {
	l := driverTarget.Load()
	if l == nil {
		return
	}
	l.Warn(strings.TrimSpace(fmt.Sprint(v...)))
}
