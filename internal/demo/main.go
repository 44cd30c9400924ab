// Command demo shows cdcout end to end on this machine: it starts a
// throwaway MariaDB with the binlog on, a webhook receiver (`cdcout
// receive`), two `cdcout run` replicas sharing one outbox, and a writer that
// inserts, updates and deletes rows for a few seconds. It prints what the
// receiver got and exits 0 once every change has arrived. `make demo`.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/cdcout/cdcout/internal/mysqltest"
)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func run(ctx context.Context) error {
	start := time.Now()
	tmp, err := os.MkdirTemp("", "cdcout-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	step("building cdcout")
	bin := filepath.Join(tmp, "cdcout")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build: %w", err)
	}

	step("starting a throwaway MariaDB (binlog_format=ROW, GTIDs)")
	srv, err := mysqltest.StartServer(mysqltest.Options{})
	if err != nil {
		return err
	}
	defer srv.Stop()
	db, err := sql.Open("mysql", srv.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, q := range []string{
		"CREATE DATABASE shop",
		`CREATE TABLE shop.orders (
		   id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
		   customer VARCHAR(100) NOT NULL,
		   amount DECIMAL(12,2) NOT NULL,
		   status ENUM('new','paid','shipped','cancelled') NOT NULL DEFAULT 'new')`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}

	recvAddr, err := freeAddr()
	if err != nil {
		return err
	}
	rcv, recv, err := startReceiver(ctx, bin, recvAddr)
	if err != nil {
		return err
	}
	procs := []*proc{recv}
	defer func() {
		for _, p := range procs {
			stopProc(p, 10*time.Second)
		}
	}()

	step("starting 2 cdcout replicas sharing one outbox")
	for i := 1; i <= 2; i++ {
		out, p, err := startProc(ctx, fmt.Sprintf("cdcout-%d", i), bin, "run",
			"--dsn", srv.DSN,
			"--tables", "shop.*",
			"--sink", "hook=http://"+recvAddr+"/hook",
			"--replica-id", fmt.Sprintf("demo-%d", i),
			"--server-id", fmt.Sprint(1000+i),
			"--from", "start",
			"--http-addr", "off",
			"--log-format", "console")
		if err != nil {
			return err
		}
		go io.Copy(io.Discard, out)
		procs = append(procs, p)
	}

	step("writing: inserts, updates and deletes for 5 seconds")
	changes, err := write(ctx, db, 5*time.Second)
	if err != nil {
		return err
	}
	fmt.Printf("    %d row changes committed\n", changes)

	step("waiting for every change to reach the receiver")
	if err := rcv.wait(ctx, changes, 60*time.Second); err != nil {
		return err
	}
	step("what the receiver got (first 5 of each kind)")
	if err := rcv.show(changes); err != nil {
		return err
	}

	step("cdcout status (read from the state database)")
	status := exec.CommandContext(ctx, bin, "status", "--dsn", srv.DSN)
	status.Stdout, status.Stderr = os.Stdout, os.Stderr
	if err := status.Run(); err != nil {
		return fmt.Errorf("cdcout status: %w", err)
	}

	step("stopping the replicas (SIGTERM: finish in-flight work, release leases)")
	for _, p := range procs[1:] {
		if err := stopProc(p, 20*time.Second); err != nil {
			return err
		}
	}
	fmt.Printf("demo finished in %s: every committed change was delivered\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// write runs a mixed workload and returns how many row changes it committed.
func write(ctx context.Context, db *sql.DB, d time.Duration) (int, error) {
	customers := []string{"ada", "grace", "linus", "barbara", "ken"}
	statuses := []string{"paid", "shipped", "cancelled"}
	var ids []int64
	changes := 0
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		var res sql.Result
		var err error
		switch r := rand.IntN(10); {
		case r < 5 || len(ids) < 5:
			res, err = db.ExecContext(ctx, "INSERT INTO shop.orders (customer, amount) VALUES (?, ?)",
				customers[rand.IntN(len(customers))], fmt.Sprintf("%d.%02d", rand.IntN(500), rand.IntN(100)))
			if err == nil {
				id, _ := res.LastInsertId()
				ids = append(ids, id)
			}
		case r < 8:
			res, err = db.ExecContext(ctx, "UPDATE shop.orders SET status = ? WHERE id = ?",
				statuses[rand.IntN(len(statuses))], ids[rand.IntN(len(ids))])
		default:
			i := rand.IntN(len(ids))
			res, err = db.ExecContext(ctx, "DELETE FROM shop.orders WHERE id = ?", ids[i])
			ids = append(ids[:i], ids[i+1:]...)
		}
		if err != nil {
			return changes, fmt.Errorf("write: %w", err)
		}
		n, _ := res.RowsAffected()
		changes += int(n)
		time.Sleep(10 * time.Millisecond)
	}
	return changes, nil
}

func startProc(ctx context.Context, name, bin string, args ...string) (io.Reader, *proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = prefixWriter(name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	return out, p, nil
}

func stopProc(p *proc, grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			return fmt.Errorf("%s exited with code %d after SIGTERM", p.name, code)
		}
		return nil
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
		return errors.New(p.name + " did not stop within " + grace.String() + " of SIGTERM")
	}
}

// prefixWriter labels a child's log lines; only warnings and errors are
// shown so the demo's output stays readable.
func prefixWriter(name string) io.Writer {
	r, w := io.Pipe()
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, "WARN") || strings.Contains(line, "ERROR") || strings.Contains(line, "cdcout:") {
				fmt.Fprintf(os.Stderr, "    [%s] %s\n", name, line)
			}
		}
	}()
	return w
}

func step(s string) { fmt.Printf("==> %s\n", s) }

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// received is what the demo's receiver printed: every delivery, and the
// distinct delivery ids.
type received struct {
	mu       sync.Mutex
	lines    []string
	distinct map[string]bool
}

// startReceiver starts `cdcout receive` on addr and collects what it
// prints.
func startReceiver(ctx context.Context, bin, addr string) (*received, *proc, error) {
	out, p, err := startProc(ctx, "receiver", bin, "receive", "--addr", addr)
	if err != nil {
		return nil, nil, err
	}
	r := &received{distinct: map[string]bool{}}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var env struct {
				ID string `json:"id"`
			}
			json.Unmarshal(sc.Bytes(), &env)
			r.mu.Lock()
			r.lines = append(r.lines, sc.Text())
			r.distinct[env.ID] = true
			r.mu.Unlock()
		}
	}()
	return r, p, nil
}

// wait waits until changes distinct records arrived, at most timeout.
func (r *received) wait(ctx context.Context, changes int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		r.mu.Lock()
		n := len(r.distinct)
		r.mu.Unlock()
		if n >= changes {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("receiver got %d of %d changes after %.0fs", n, changes, timeout.Seconds())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// show prints the first 5 deliveries of each kind and checks that every
// one of changes arrived.
func (r *received) show(changes int) error {
	r.mu.Lock()
	got := append([]string(nil), r.lines...)
	r.mu.Unlock()
	shown := map[string]int{}
	ids := map[string]bool{}
	for _, line := range got {
		var env struct {
			ID     string `json:"id"`
			Op     string `json:"op"`
			Key    any    `json:"key"`
			Before any    `json:"before"`
			After  any    `json:"after"`
		}
		if err := json.Unmarshal([]byte(line), &env); err != nil {
			return fmt.Errorf("receiver printed something that is not an envelope: %q", line)
		}
		ids[env.ID] = true
		if shown[env.Op] < 5 {
			shown[env.Op]++
			fmt.Printf("    %s\n", line)
		}
	}
	fmt.Printf("    %d deliveries, %d distinct delivery ids, %d changes committed\n", len(got), len(ids), changes)
	if len(ids) < changes {
		return fmt.Errorf("only %d distinct changes arrived of %d", len(ids), changes)
	}
	return nil
}
