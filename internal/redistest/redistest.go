// Package redistest starts throwaway redis-server processes for tests:
// one per test, on a free loopback port, with persistence off, stopped
// when the test ends. When redis-server cannot be started the test fails
// under CI=true and is skipped otherwise, so a missing server never turns
// CI green.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Options configure a server.
type Options struct {
	// Password, when set, is required of every client (requirepass).
	Password string
}

// Server is a running redis-server.
type Server struct {
	// Addr is host:port.
	Addr string
	opts Options
	dir  string
	cmd  *exec.Cmd
}

// Start starts a server of the test's own.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s := &Server{opts: opts, dir: tb.TempDir()}
	var err error
	for range 5 { // another process may take the free port first
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("redis-server unavailable (CI=true, so this fails): %v", err)
		}
		tb.Skipf("redis-server unavailable: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// URL is redis://[:password@]addr followed by path (a stream template).
func (s *Server) URL(path string) string {
	auth := ""
	if s.opts.Password != "" {
		auth = ":" + s.opts.Password + "@"
	}
	return "redis://" + auth + s.Addr + path
}

func (s *Server) start() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return errors.New("redis-server is not installed; run: sudo apt-get install -y redis-server")
	}
	if s.Addr == "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		s.Addr = l.Addr().String()
		l.Close()
	}
	_, port, _ := net.SplitHostPort(s.Addr)
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--daemonize", "no", "--loglevel", "warning"}
	if s.opts.Password != "" {
		args = append(args, "--requirepass", s.opts.Password)
	}
	cmd := exec.Command(bin, args...)
	logf, err := os.Create(s.dir + "/redis.log")
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s.ping() == nil {
			s.cmd = cmd
			go func() { <-exited }()
			return nil
		}
		select {
		case err := <-exited:
			out, _ := os.ReadFile(s.dir + "/redis.log")
			s.Addr = ""
			return fmt.Errorf("redis-server exited: %v: %s", err, strings.TrimSpace(string(out)))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return errors.New("redis-server did not answer PING within 10 s")
		}
	}
}

// ping sends PING (after AUTH when a password is set) over RESP.
func (s *Server) ping() error {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	r := bufio.NewReader(c)
	if s.opts.Password != "" {
		fmt.Fprintf(c, "*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n", len(s.opts.Password), s.opts.Password)
		if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
			return fmt.Errorf("auth: %q %v", line, err)
		}
	}
	fmt.Fprint(c, "*1\r\n$4\r\nPING\r\n")
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("ping answered %q", strings.TrimSpace(line))
	}
	return nil
}

// Stop kills the server; its data is gone (persistence is off).
func (s *Server) Stop() {
	if s.cmd != nil {
		s.cmd.Process.Kill()
		s.cmd = nil
		// Wait until the port is free again so Restart can bind it.
		for range 200 {
			c, err := net.DialTimeout("tcp", s.Addr, 50*time.Millisecond)
			if err != nil {
				return
			}
			c.Close()
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Restart starts the server again on the same address, empty.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if err := s.start(); err != nil {
		tb.Fatalf("restart redis-server: %v", err)
	}
}
