// Package faultproxy is an in-process TCP proxy for fault tests: it sits
// between cdcout and a dependency (the source, the state database, a sink)
// and can blackhole the link (sockets stay open, nothing is forwarded),
// reset every connection, refuse new ones, lose answers (a request reaches
// the server, the link dies before its answer comes back), or delay what
// it forwards.
//
// A blackhole holds what it read and forwards it on Heal, which is what a
// real partition does to a TCP connection that survives it (the peer
// retransmits); a connection that does not survive it is the Reset case.
package faultproxy

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections made to Addr to a target address.
type Proxy struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	cond   *sync.Cond
	hole   bool          // blackholed: pumps hold their data
	refuse bool          // new connections are closed at once
	cut    []byte        // answers lost to requests holding cut (LoseAnswersTo)
	lost   int           // links reset for a lost answer
	delay  time.Duration // added before each forwarded chunk
	conns  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

type link struct {
	client, server net.Conn
	dead           bool // reset: a held pump gives up (guarded by Proxy.mu)
	asked          bool // sent a request whose answer is to be lost (guarded by Proxy.mu)
}

// Start listens on a random loopback port and forwards to target
// ("host:port").
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[*link]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's "host:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Blackhole stops forwarding in both directions, on open connections and
// new ones, until Heal. Nothing is closed.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.hole = true
	p.mu.Unlock()
}

// Refuse makes the proxy close new connections at once (a dead server's
// port), until Heal.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	p.refuse = true
	p.mu.Unlock()
}

// LoseAnswersTo makes the answers to requests holding pattern (every
// request, for "") get lost, until Heal: the request reaches the server
// (a statement runs, a COMMIT commits) and, when the server answers, the
// link is reset instead.
func (p *Proxy) LoseAnswersTo(pattern string) {
	p.mu.Lock()
	p.cut = []byte(pattern)
	p.mu.Unlock()
}

// Lost is how many links were reset for a lost answer.
func (p *Proxy) Lost() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lost
}

// Heal ends a blackhole, refusal and lost answers: held data is forwarded.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.hole, p.refuse, p.cut = false, false, nil
	p.cond.Broadcast()
	p.mu.Unlock()
}

// SetDelay delays every forwarded chunk by d (0 for none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Reset aborts every open connection with a TCP RST on both sides, and
// returns how many it aborted. New connections are accepted as before.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		l.dead = true
		links = append(links, l)
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	for _, l := range links {
		abort(l.client)
		abort(l.server)
	}
	return len(links)
}

// Conns is the number of open proxied connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops listening, aborts every connection and waits for the pumps.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed, p.hole, p.refuse = true, false, false
	p.cond.Broadcast()
	p.mu.Unlock()
	p.ln.Close()
	p.Reset()
	p.wg.Wait()
}

func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse || p.closed
		p.mu.Unlock()
		if refuse {
			abort(c)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		abort(client)
		return
	}
	l := &link{client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		abort(client)
		abort(server)
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(l, server, client) }()
	go func() { defer wg.Done(); p.pump(l, client, server) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

// pump copies src to dst chunk by chunk, holding each chunk while the
// proxy is blackholed. When either side ends, both are closed.
func (p *Proxy) pump(l *link, dst, src net.Conn) {
	defer abort(dst)
	defer abort(src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.hole && !p.closed && !l.dead {
				p.cond.Wait()
			}
			delay, dead := p.delay, l.dead
			if dst == l.server && p.cut != nil && bytes.Contains(buf[:n], p.cut) {
				l.asked = true
			}
			cut := dst == l.client && !dead && l.asked && p.cut != nil
			if cut {
				l.dead = true
				p.lost++
			}
			p.mu.Unlock()
			if cut {
				abort(l.client)
				abort(l.server)
			}
			if dead || cut {
				return
			}
			if delay > 0 {
				time.Sleep(delay)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or an abort: the deferred closes end the other pump
		}
	}
}
