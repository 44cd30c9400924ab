package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer echoes every line back.
func echoServer(t *testing.T) string { return recordingEchoServer(t, nil) }

// recordingEchoServer echoes every line back, after sending it on got
// unless got is nil.
func recordingEchoServer(t *testing.T, got chan<- string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if got != nil {
						got <- line
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

// proxyTo starts a proxy to addr and dials it; both close with the test.
func proxyTo(t *testing.T, addr string) (*Proxy, net.Conn) {
	t.Helper()
	p, err := Start(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return p, c
}

// Forwarding, a blackhole that holds data until healed, a reset that
// aborts open connections, and refusal of new ones.
func TestProxyFaults(t *testing.T) {
	p, c := proxyTo(t, echoServer(t))
	r := bufio.NewReader(c)
	if got, err := roundTrip(c, r, 2*time.Second); err != nil || got != "ping\n" {
		t.Fatalf("forwarded = %q, %v; want ping", got, err)
	}

	p.Blackhole()
	if got, err := roundTrip(c, r, 200*time.Millisecond); err == nil {
		t.Fatalf("blackholed link answered %q", got)
	}
	p.Heal()
	// The held ping arrives after the heal.
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "ping\n" {
		t.Fatalf("after heal = %q, %v; want the held ping", got, err)
	}

	if n := p.Reset(); n != 1 {
		t.Fatalf("reset %d connections, want 1", n)
	}
	if _, err := roundTrip(c, r, 2*time.Second); err == nil {
		t.Fatal("a reset connection still works")
	}

	p.Refuse()
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		_, err = roundTrip(c2, bufio.NewReader(c2), 2*time.Second)
		c2.Close()
	}
	if err == nil {
		t.Fatal("a refused connection works")
	}
	p.Heal()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, bufio.NewReader(c3), 2*time.Second); err != nil || got != "ping\n" {
		t.Fatalf("after refusal healed = %q, %v; want ping", got, err)
	}
}

// Lost answers: a request holding the pattern reaches the server, and
// the client's connection is reset instead of answered; other requests
// are answered; after Heal the pattern is answered too.
func TestProxyLosesAnswers(t *testing.T) {
	got := make(chan string, 4)
	addr := recordingEchoServer(t, got)
	p, c := proxyTo(t, addr)
	p.LoseAnswersTo("ping")
	c0, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	r0 := bufio.NewReader(c0)
	_ = c0.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c0.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	if ans, err := r0.ReadString('\n'); err != nil || ans != "pong\n" {
		t.Fatalf("a request without the pattern = %q, %v; want its answer", ans, err)
	}
	<-got
	if ans, err := roundTrip(c, bufio.NewReader(c), 2*time.Second); err == nil {
		t.Fatalf("an answer came through while answers are lost: %q", ans)
	}
	select {
	case line := <-got:
		if line != "ping\n" {
			t.Fatalf("server got %q, want ping", line)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the request did not reach the server")
	}
	if n := p.Lost(); n != 1 {
		t.Fatalf("Lost() = %d, want 1", n)
	}
	p.Heal()
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if ans, err := roundTrip(c2, bufio.NewReader(c2), 2*time.Second); err != nil || ans != "ping\n" {
		t.Fatalf("after heal = %q, %v; want ping", ans, err)
	}
}
