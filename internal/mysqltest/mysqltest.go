// Package mysqltest starts throwaway MariaDB or Oracle MySQL servers with the
// binary log on, for tests, benchmarks and the demo.
//
// Every integration test in cdcout runs against a real server: the binlog is
// the product's input, and a mock of it would only test our reading of the
// mock. A server takes about two seconds to start, so a test package shares
// one (Shared) and gives each test its own databases (Server.CreateDB); tests
// that restart or reconfigure the server start their own (Start).
//
// CDCOUT_TEST_FLAVOR chooses the product: "mariadb" (the default) or
// "mysql" (Oracle MySQL from the private prefix .ci/install-mysql fills;
// see mysql.go). CDCOUT_TEST_DSN points the shared server at an existing
// MySQL/MariaDB instead (for example a user's MySQL 8 with binlog_format=ROW). When the
// server cannot be started the test fails under CI=true and is skipped
// otherwise, so a missing database never turns CI green.
package mysqltest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Options change how a server is started.
type Options struct {
	// ServerID is the server's --server-id; 0 means 1.
	ServerID int
	// RowMetadata is --binlog-row-metadata; "" means FULL.
	RowMetadata string
	// Args are appended to the server's command line, e.g.
	// "--skip-log-bin". Options only one flavour has belong behind a
	// check of testFlavor.
	Args []string
	// Flavor is the product to start; "" means testFlavor().
	Flavor Flavor
}

// Server is one running throwaway server (or the server CDCOUT_TEST_DSN
// names, which is never stopped by this package).
type Server struct {
	// DSN is a go-sql-driver DSN for root with no default database.
	DSN  string
	Host string
	Port int
	User string
	// Password is empty for throwaway servers.
	Password string
	// Flavor is the server's product.
	Flavor Flavor

	opts    Options
	dataDir string
	cmd     *exec.Cmd
	exited  chan struct{}
	owned   bool
	mu      sync.Mutex
}

var (
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
	dbCounter  atomic.Int64
)

// Shared returns the package-wide server, starting it on first use. The
// package's TestMain must run its tests through Run or RunMain, which stop
// it: a test binary that exits without that leaves the server running (a
// package without it left one per flavour behind on every CI run), so
// Shared fails the test instead.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	if !inRun.Load() {
		tb.Fatal("mysqltest.Shared: the package's TestMain must call mysqltest.RunMain (or Run), which stops the shared server")
	}
	sharedOnce.Do(func() {
		if dsn := os.Getenv("CDCOUT_TEST_DSN"); dsn != "" {
			shared, sharedErr = fromDSN(dsn)
			return
		}
		shared, sharedErr = StartServer(Options{})
	})
	if sharedErr != nil {
		unavailable(tb, sharedErr)
	}
	return shared
}

// inRun is whether the tests run inside Run, which stops the shared
// server after them.
var inRun atomic.Bool

// RunMain runs the package's tests, stops the shared server and exits.
func RunMain(m *testing.M) { os.Exit(Run(m)) }

// Run runs the package's tests, stops the shared server and returns the
// exit code, for a TestMain with more to clean up.
func Run(m *testing.M) int {
	inRun.Store(true)
	code := m.Run()
	StopShared()
	return code
}

// StopShared stops the shared server if this process started it.
func StopShared() {
	if shared != nil {
		shared.Stop()
	}
}

// Start starts a server of the test's own, stopped when the test ends.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s, err := StartServer(opts)
	if err != nil {
		unavailable(tb, err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("test database unavailable (CI=true, so this fails): %v", err)
	}
	tb.Skipf("test database unavailable: %v", err)
}

// fromDSN wraps an existing server; Stop leaves it running.
func fromDSN(dsn string) (*Server, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse CDCOUT_TEST_DSN: %w", err)
	}
	host, portStr, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("CDCOUT_TEST_DSN address %q: %w", cfg.Addr, err)
	}
	port, _ := strconv.Atoi(portStr)
	cfg.DBName = ""
	s := &Server{DSN: cfg.FormatDSN(), Host: host, Port: port, User: cfg.User, Password: cfg.Passwd}
	if err := s.waitReady(30 * time.Second); err != nil {
		return nil, err
	}
	flavor, err := detectFlavor(s.DSN)
	if err != nil {
		return nil, err
	}
	s.Flavor = flavor
	return s, nil
}

// StartServer starts a new throwaway server. The caller must Stop it.
func StartServer(opts Options) (*Server, error) {
	if opts.Flavor == "" {
		opts.Flavor = testFlavor()
	}
	if err := ensureInstalled(opts.Flavor); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cdcout-"+string(opts.Flavor)+"-")
	if err != nil {
		return nil, err
	}
	s := &Server{Host: "127.0.0.1", User: "root", Flavor: opts.Flavor, opts: opts, dataDir: dir, owned: true}
	// Each server has a temporary directory of its own. Bootstraps that
	// share /tmp collide on their temporary tables' file names when test
	// packages start servers at the same time ("Unknown table
	// 'mysql.tmp_user_nopasswd'", install exits 1).
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := initDataDir(opts.Flavor, dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// initDataDir creates dir/data: mariadb-install-db for MariaDB, a copy of
// the run's template datadir for MySQL.
func initDataDir(flavor Flavor, dir string) error {
	if flavor == MySQL {
		return mysqlDataDir(dir)
	}
	install := exec.Command("mariadb-install-db", "--no-defaults",
		"--datadir="+filepath.Join(dir, "data"), "--tmpdir="+filepath.Join(dir, "tmp"),
		"--user="+currentUser(), "--auth-root-authentication-method=normal", "--skip-test-db")
	if out, err := install.CombinedOutput(); err != nil {
		return fmt.Errorf("mariadb-install-db: %w: %s", err, errorLines(string(out), 5))
	}
	return nil
}

func (s *Server) launch() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	s.Port = port
	s.DSN = fmt.Sprintf("root@tcp(127.0.0.1:%d)/?parseTime=false&multiStatements=true", port)
	serverID := s.opts.ServerID
	if serverID == 0 {
		serverID = 1
	}
	meta := s.opts.RowMetadata
	if meta == "" {
		meta = "FULL"
	}
	args := []string{
		"--no-defaults",
		"--datadir=" + filepath.Join(s.dataDir, "data"),
		"--tmpdir=" + filepath.Join(s.dataDir, "tmp"),
		"--socket=" + filepath.Join(s.dataDir, "mysqld.sock"),
		"--pid-file=" + filepath.Join(s.dataDir, "mysqld.pid"),
		"--log-error=" + filepath.Join(s.dataDir, "error.log"),
		"--port=" + strconv.Itoa(port),
		"--bind-address=127.0.0.1",
		"--user=" + currentUser(),
		"--skip-name-resolve",
		"--log-bin=" + filepath.Join(s.dataDir, "data", "binlog"),
		"--binlog-format=ROW",
		"--binlog-row-image=FULL",
		"--binlog-row-metadata=" + meta,
		"--server-id=" + strconv.Itoa(serverID),
		"--character-set-server=utf8mb4",
		"--default-time-zone=+00:00",
		"--innodb-buffer-pool-size=256M",
		"--innodb-flush-log-at-trx-commit=2",
		"--sync-binlog=0",
		"--max-connections=500",
		"--max-allowed-packet=256M",
	}
	var cmd *exec.Cmd
	if s.Flavor == MySQL {
		args = append(args, mysqlArgs()...)
		args = append(args, s.opts.Args...)
		cmd = mysqlCommand("mysqld", args...)
	} else {
		args = append(args,
			"--gtid-strict-mode=ON",
			"--log-slave-updates=ON",
			"--collation-server=utf8mb4_general_ci",
			"--innodb-log-file-size=256M")
		args = append(args, s.opts.Args...)
		cmd = exec.Command(mariadbd(), args...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s server: %w", s.Flavor, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	if err := s.waitReady(60 * time.Second); err != nil {
		s.kill()
		log, _ := os.ReadFile(filepath.Join(s.dataDir, "error.log"))
		return fmt.Errorf("%w; %s server log: %s", err, s.Flavor, errorLines(string(log), 8))
	}
	return nil
}

func (s *Server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if s.exited != nil {
			select {
			case <-s.exited:
				return fmt.Errorf("%s server exited during start-up", s.Flavor)
			default:
			}
		}
		var db *sql.DB
		if db, err = sql.Open("mysql", s.DSN); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err = db.PingContext(ctx)
			cancel()
			db.Close()
			if err == nil {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("server at %s:%d not ready after %s: %v", s.Host, s.Port, timeout, err)
}

// Stop stops the server and removes its data directory. Servers given by
// CDCOUT_TEST_DSN are left running.
func (s *Server) Stop() {
	if !s.owned {
		return
	}
	s.kill()
	os.RemoveAll(s.dataDir)
}

func (s *Server) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// Restart stops the server abruptly (SIGKILL, as a crash) and starts it
// again on the same port and data directory.
func (s *Server) Restart() error {
	if !s.owned {
		return errors.New("cannot restart a server given by CDCOUT_TEST_DSN")
	}
	port := s.Port
	s.kill()
	s.Port = port
	return s.relaunchOnPort(port)
}

// RestartClean shuts the server down cleanly (SIGTERM, as an operator's
// restart; SIGKILL after a minute) and starts it again on the same port
// and data directory. Unlike Restart it cannot leave a torn event at the
// end of the binary log: with --sync-binlog=0 a crash in the middle of a
// large transaction's binlog write can, and MariaDB then refuses to send
// past it ("binlog truncated in the middle of event").
func (s *Server) RestartClean() error {
	if !s.owned {
		return errors.New("cannot restart a server given by CDCOUT_TEST_DSN")
	}
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			s.kill()
		}
	}
	return s.relaunchOnPort(s.Port)
}

// Kill stops the server abruptly and leaves it stopped; Restart or
// StartAgain brings it back.
func (s *Server) Kill() { s.kill() }

// StartAgain starts a killed server on its old port.
func (s *Server) StartAgain() error { return s.relaunchOnPort(s.Port) }

func (s *Server) relaunchOnPort(port int) error {
	// launch picks a free port; keep the old one so DSNs stay valid.
	orig := freePortOverride
	freePortOverride = port
	defer func() { freePortOverride = orig }()
	var err error
	for i := 0; i < 50; i++ {
		if err = s.launch(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

// DataDir is the server's temporary directory (datadir is DataDir/data).
func (s *Server) DataDir() string { return s.dataDir }

// DSNWith is the server's DSN with one more parameter ("name=value").
func (s *Server) DSNWith(param string) string {
	if strings.Contains(s.DSN, "?") {
		return s.DSN + "&" + param
	}
	return s.DSN + "?" + param
}

// Open opens a connection pool to the server, closed when the test ends.
func (s *Server) Open(tb testing.TB) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", s.DSN)
	if err != nil {
		tb.Fatalf("open %s: %v", s.Host, err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// CreateDB creates a database with a unique name for one test and drops it
// when the test ends.
func (s *Server) CreateDB(tb testing.TB, prefix string) string {
	tb.Helper()
	name := fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), dbCounter.Add(1))
	db := s.Open(tb)
	if _, err := db.Exec("CREATE DATABASE `" + name + "`"); err != nil {
		tb.Fatalf("create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		d, err := sql.Open("mysql", s.DSN)
		if err == nil {
			d.Exec("DROP DATABASE IF EXISTS `" + name + "`")
			d.Close()
		}
	})
	return name
}

// Exec runs statements on the server, failing the test on error.
func (s *Server) Exec(tb testing.TB, stmts ...string) {
	tb.Helper()
	db, err := sql.Open("mysql", s.DSN)
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			tb.Fatalf("exec %q: %v", q, err)
		}
	}
}

var freePortOverride int

// FreeAddr is a loopback address (127.0.0.1:port) nothing listens on right
// now, for a test's own listeners and proxies.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func freePort() (int, error) {
	if freePortOverride != 0 {
		return freePortOverride, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var installMu sync.Mutex

// ensureInstalled installs the flavour's server when its binaries are
// missing (a fresh CI machine), as the project's own set-up step: Debian's
// mariadb-server, or Oracle MySQL through .ci/install-mysql.
func ensureInstalled(flavor Flavor) error {
	installMu.Lock()
	defer installMu.Unlock()
	if flavor == MySQL {
		return ensureMySQL()
	}
	if _, err := exec.LookPath("mariadb-install-db"); err == nil && mariadbd() != "" {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("mariadb-server is not installed; run: sudo apt-get install -y mariadb-server")
	}
	for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "mariadb-server", "mariadb-client"}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %s: %w: %s", strings.Join(args, " "), err, lastLines(string(out), 5))
		}
	}
	if mariadbd() == "" {
		return errors.New("mariadbd not found after installing mariadb-server")
	}
	return nil
}

func mariadbd() string {
	for _, name := range []string{"mariadbd", "mysqld"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	for _, p := range []string{"/usr/sbin/mariadbd", "/usr/sbin/mysqld"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

func currentUser() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	if os.Geteuid() == 0 {
		return "root"
	}
	return strconv.Itoa(os.Geteuid())
}

// errorLines is the output's ERROR and Warning lines (the cause; the last
// lines of a failed bootstrap are only its advice on filing a bug), or its
// last n lines when it has none.
func errorLines(s string, n int) string {
	var found []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, "ERROR") || strings.Contains(line, "[Warning]") {
			found = append(found, strings.TrimSpace(line))
		}
	}
	if len(found) == 0 {
		return lastLines(s, n)
	}
	if len(found) > n {
		found = found[:n]
	}
	return strings.Join(found, " | ")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// CPUTime is the CPU time (user + system) the server process has used so
// far, read from /proc; ok is false for a server this package did not
// start (CDCOUT_TEST_DSN) or where /proc cannot tell. Benchmarks report the
// database's CPU per change with it: unlike wall-clock rates, that figure
// does not move with whatever else shares the machine.
func (s *Server) CPUTime() (d time.Duration, ok bool) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return 0, false
	}
	return ProcessCPUTime(cmd.Process.Pid)
}

// ProcessCPUTime is the CPU time (user + system) process pid has used, from
// /proc/<pid>/stat.
func ProcessCPUTime(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis are plain. utime and stime are fields 14 and 15,
	// in clock ticks (100 per second on Linux).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * (time.Second / 100), true
}

// OwnCPUTime is the CPU time (user + system) this process has used.
func OwnCPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
