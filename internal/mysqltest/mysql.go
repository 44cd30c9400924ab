package mysqltest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Flavor names a server product. The binary log formats differ (GTIDs,
// event types, compression), so the suite runs on both.
type Flavor string

const (
	MariaDB Flavor = "mariadb"
	MySQL   Flavor = "mysql"
)

// testFlavor is the flavour CDCOUT_TEST_FLAVOR asks for ("mariadb" when
// unset). An unknown value panics in the first test that asks, so a typo
// never runs the suite on the wrong flavour.
func testFlavor() Flavor {
	switch v := strings.ToLower(os.Getenv("CDCOUT_TEST_FLAVOR")); v {
	case "", "mariadb":
		return MariaDB
	case "mysql":
		return MySQL
	default:
		panic(fmt.Sprintf("CDCOUT_TEST_FLAVOR=%q: want mariadb or mysql", v))
	}
}

// detectFlavor asks the server at dsn which product it is.
func detectFlavor(dsn string) (Flavor, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return "", err
	}
	defer db.Close()
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		return "", fmt.Errorf("read server version: %w", err)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return MariaDB, nil
	}
	return MySQL, nil
}

// mysqlPrefix is where .ci/install-mysql unpacks Oracle MySQL:
// $CDCOUT_MYSQL_PREFIX, else ${XDG_CACHE_HOME:-$HOME/.cache}/cdcout/mysql
// (/tmp/.cache/… without a home directory).
func mysqlPrefix() string {
	if p := os.Getenv("CDCOUT_MYSQL_PREFIX"); p != "" {
		return p
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil || home == "" {
			home = "/tmp" // as .ci/install-mysql does without $HOME
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "cdcout", "mysql")
}

func mysqlRoot() string { return filepath.Join(mysqlPrefix(), "root") }

// mysqlCommand runs one of the unpacked MySQL programs (mysqld in
// usr/sbin, the clients in usr/bin) through the unpacked loader, so it gets
// the glibc and libstdc++ it was built against rather than the system's.
func mysqlCommand(name string, args ...string) *exec.Cmd {
	root := mysqlRoot()
	lib := filepath.Join(root, "usr", "lib", "x86_64-linux-gnu")
	prog := filepath.Join(root, "usr", "bin", name)
	if name == "mysqld" {
		prog = filepath.Join(root, "usr", "sbin", name)
	}
	full := append([]string{"--library-path", lib + ":/usr/lib/x86_64-linux-gnu", prog}, args...)
	return exec.Command(filepath.Join(lib, "ld-linux-x86-64.so.2"), full...)
}

// mysqlBaseArgs are the options every mysqld invocation needs to find its
// own files in the private prefix.
func mysqlBaseArgs() []string {
	root := mysqlRoot()
	return []string{
		"--basedir=" + filepath.Join(root, "usr"),
		"--lc-messages-dir=" + filepath.Join(root, "usr", "share", "mysql"),
		"--plugin-dir=" + filepath.Join(root, "usr", "lib", "mysql", "plugin"),
		// Without it mysqld refuses to start when its default
		// secure-file-priv directory does not exist.
		"--secure-file-priv=",
	}
}

// mysqlArgs are the MySQL-only options of a running test server (launch
// adds the ones both flavours share).
func mysqlArgs() []string {
	return append(mysqlBaseArgs(),
		"--gtid-mode=ON",
		"--enforce-gtid-consistency=ON",
		"--log-replica-updates=ON",
		"--innodb-redo-log-capacity=256M",
		"--mysqlx=OFF",
		"--performance-schema=OFF",
		"--skip-replica-start")
}

// ensureMySQL runs .ci/install-mysql when the private prefix holds no
// working mysqld.
func ensureMySQL() error {
	if err := mysqlCommand("mysqld", "--version").Run(); err == nil {
		return nil
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", ".ci", "install-mysql")
	out, err := exec.Command("bash", script).CombinedOutput()
	if err != nil {
		return fmt.Errorf("install Oracle MySQL (%s): %w: %s", script, err, lastLines(string(out), 5))
	}
	return mysqlCommand("mysqld", "--version").Run()
}

// mysqlDataDir copies the run's template datadir into dir/data.
// Initialising a MySQL datadir takes several seconds; copying one takes a
// fraction of one, so every server of a run (and of later runs with the
// same mysqld) starts from one template.
func mysqlDataDir(dir string) error {
	tmpl, err := mysqlTemplate()
	if err != nil {
		return err
	}
	data := filepath.Join(dir, "data")
	if out, err := exec.Command("cp", "-a", tmpl, data).CombinedOutput(); err != nil {
		return fmt.Errorf("copy MySQL template datadir: %w: %s", err, out)
	}
	// auto.cnf holds server_uuid: every copy would otherwise share it, and
	// so the source id of its GTIDs.
	if err := os.Remove(filepath.Join(data, "auto.cnf")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// mysqlTemplate returns the template datadir for the installed mysqld,
// creating it under a file lock when missing (test packages run as
// separate processes at the same time).
func mysqlTemplate() (string, error) {
	out, err := mysqlCommand("mysqld", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("mysqld --version: %w", err)
	}
	version := strings.Fields(strings.TrimSpace(string(out)))
	tag := "unknown"
	for i, f := range version {
		if f == "Ver" && i+1 < len(version) {
			tag = version[i+1]
		}
	}
	base := filepath.Join(mysqlPrefix(), "template-"+tag)
	tmpl := filepath.Join(base, "data")
	if _, err := os.Stat(filepath.Join(tmpl, "mysql.ibd")); err == nil {
		return tmpl, nil
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(base, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(filepath.Join(tmpl, "mysql.ibd")); err == nil {
		return tmpl, nil
	}
	work, err := os.MkdirTemp(base, "init-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	// With --skip-name-resolve root@localhost does not match TCP
	// connections from 127.0.0.1, so the template gets root@127.0.0.1.
	initSQL := filepath.Join(work, "init.sql")
	if err := os.WriteFile(initSQL, []byte("CREATE USER 'root'@'127.0.0.1' IDENTIFIED BY '';\n"+
		"GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.Mkdir(filepath.Join(work, "tmp"), 0o700); err != nil {
		return "", err
	}
	// --no-defaults must come first.
	args := append(append([]string{"--no-defaults"}, mysqlBaseArgs()...),
		"--datadir="+filepath.Join(work, "data"), "--tmpdir="+filepath.Join(work, "tmp"),
		"--user="+currentUser(), "--initialize-insecure", "--init-file="+initSQL)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := mysqlCommand("mysqld", args...)
	cmd = exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mysqld --initialize-insecure: %w: %s", err, errorLines(string(out), 5))
	}
	if err := os.Rename(filepath.Join(work, "data"), tmpl); err != nil {
		return "", err
	}
	return tmpl, nil
}

// OnlyFlavor skips a test that exercises one flavour's own binary log
// feature (MariaDB's compressed events, MySQL's transaction payloads) when
// the suite runs on the other; the other flavour's run has its own test,
// named in why.
func OnlyFlavor(tb testing.TB, srv *Server, f Flavor, why string) {
	tb.Helper()
	if srv.Flavor != f {
		tb.Skipf("%s only (%s); this server is %s", f, why, srv.Flavor)
	}
}
