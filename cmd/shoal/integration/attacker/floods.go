package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"shoal/shard"
	"shoal/transport"
)

// layoutAttack asks the agent at o.server, which holds model o.model's
// file, for the signed layout of the whole model cut in pieces of each
// size in o.pieces (1 byte: a checksum per byte of the file).
func layoutAttack(ctx context.Context, o opts, res *result) {
	ep, _ := endpoint(o.tlsDir, o.bind, 0)
	defer ep.Close()
	call := func(ctx context.Context, method string, in, out any) error {
		return transport.Call(ctx, ep, o.server, transport.KindRPC, method, in, out)
	}
	st := readState(ctx, call)
	m := st.Models[o.model]
	if m == nil || m.Digest == "" {
		fail(fmt.Sprintf("no hashed model %q in the state", o.model))
	}
	spec := shard.ShardSpec{Model: o.model, FileSHA: m.Digest, Lo: 0, Hi: m.Layers, TPSize: 1, Embedding: true, Output: true}
	for _, p := range strings.Split(o.pieces, ",") {
		size, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			fail("--pieces: " + err.Error())
		}
		var raw json.RawMessage
		err = call(ctx, "Weights.Layout", struct {
			Spec      shard.ShardSpec `json:"spec"`
			PieceSize int64           `json:"piece_size"`
		}{spec, size}, &raw)
		res.Attempts = append(res.Attempts, outcome(fmt.Sprintf("layout of %s in %d-byte pieces", o.model, size), err))
		if err == nil {
			var r struct {
				Sums []string `json:"sums"`
			}
			_ = json.Unmarshal(raw, &r)
			res.Sums += len(r.Sums)
			res.Bytes += len(raw)
		}
	}
}

// distOpen opens o.count sessions (dist.open, 8 at a time) on the member
// of model o.model's plan that the agent at o.server runs (stage 0, rank
// 0 of the first pool), and leaves them open unless --close.
func distOpen(ctx context.Context, o opts, res *result) {
	ep, ident := endpoint(o.tlsDir, o.bind, 0)
	defer ep.Close()
	call := func(ctx context.Context, method string, in, out any) error {
		return transport.Call(ctx, ep, o.server, transport.KindRPC, method, in, out)
	}
	st := readState(ctx, call)
	p := st.Plans[o.model]
	if p == nil || len(p.Pools) == 0 {
		fail(fmt.Sprintf("no plan for %q in the state", o.model))
	}
	key := fmt.Sprintf("%s/v%d/%s/0/0", p.Model, p.Version, p.Pools[0].Role)
	type addr struct {
		Session string `json:"session"`
		Key     string `json:"key"`
	}
	type openReq struct {
		addr
		Version     uint64          `json:"version"`
		Pool        string          `json:"pool"`
		Stage       int             `json:"stage"`
		Rank        int             `json:"rank"`
		TimeoutMs   int64           `json:"timeout_ms"`
		Activations transport.DType `json:"activations"`
		Collectives transport.DType `json:"collectives"`
		Driver      string          `json:"driver"`
	}
	var mu sync.Mutex
	res.Codes = map[string]int{}
	record := func(name string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			res.Opened++
			return
		}
		a := outcome(name, err)
		res.Codes[strconv.Itoa(a.Code)]++
		if len(res.Attempts) < 5 {
			res.Attempts = append(res.Attempts, a)
		}
	}
	t0 := time.Now()
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	prefix := ident.Name
	if prefix == "" {
		prefix = ident.ID[:8]
	}
	for i := 0; i < o.count && ctx.Err() == nil; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			a := addr{Session: fmt.Sprintf("%s-flood-%d-%d", prefix, time.Now().UnixNano(), i), Key: key}
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			err := call(cctx, "dist.open", openReq{addr: a, Version: p.Version, Pool: p.Pools[0].Role, TimeoutMs: o.timeoutMs,
				Activations: transport.F32, Collectives: transport.F32, Driver: ep.Addr().String()}, nil)
			record(fmt.Sprintf("dist.open #%d", i), err)
			if err == nil && o.closeEach {
				if err := call(cctx, "dist.close", a, nil); err != nil {
					record(fmt.Sprintf("dist.close #%d", i), err)
				}
			}
		}(i)
	}
	wg.Wait()
	res.Seconds = time.Since(t0).Seconds()
}

// streamFlood opens o.conns QUIC connections to o.server with the
// certificate in --tls and, on each, up to o.per RPC streams that send
// their kind byte and never a request (an open that the server's stream
// limit keeps waiting 3 s ends that connection's opening). It then
// watches them for o.window: a stream the server closes or resets counts
// as closed, one still open at the end as held.
func streamFlood(ctx context.Context, o opts, res *result) {
	ident, err := transport.LoadIdentity(o.tlsDir)
	if err != nil {
		fail(fmt.Sprintf("identity: %v", err))
	}
	ua, err := net.ResolveUDPAddr("udp", o.server)
	if err != nil {
		fail(err.Error())
	}
	var opened, closed, blocked atomic.Int64
	var mu sync.Mutex
	res.Codes = map[string]int{}
	note := func(what string) {
		mu.Lock()
		res.Codes[what]++
		mu.Unlock()
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	var conns []*quic.Conn
	for c := 0; c < o.conns; c++ {
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(o.bind)})
		if err != nil {
			fail(err.Error())
		}
		tr := &quic.Transport{Conn: udp}
		defer tr.Close()
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := tr.Dial(dctx, ua, ident.ClientTLS(), &quic.Config{MaxIdleTimeout: 30 * time.Second, KeepAlivePeriod: 5 * time.Second,
			HandshakeIdleTimeout: 5 * time.Second, MaxIncomingStreams: 16})
		cancel()
		if err != nil {
			res.Attempts = append(res.Attempts, outcome(fmt.Sprintf("connection %d", c), err))
			continue
		}
		conns = append(conns, conn)
		wg.Add(1)
		go func(conn *quic.Conn) {
			defer wg.Done()
			for i := 0; i < o.per && ctx.Err() == nil; i++ {
				octx, cancel := context.WithTimeout(ctx, 3*time.Second)
				s, err := conn.OpenStreamSync(octx)
				cancel()
				if err != nil {
					blocked.Add(1)
					note("open: " + shortErr(err))
					return
				}
				if _, err := s.Write([]byte{byte(transport.KindRPC)}); err != nil {
					note("write: " + shortErr(err))
					closed.Add(1)
					opened.Add(1)
					continue
				}
				opened.Add(1)
				go func() {
					var b [1]byte
					_, err := s.Read(b[:])
					closed.Add(1)
					note("closed by the server: " + shortErr(err))
				}()
			}
		}(conn)
	}
	wg.Wait()
	res.Seconds = time.Since(t0).Seconds()
	sleep(ctx, o.window)
	res.Opened, res.Closed, res.Blocked = int(opened.Load()), int(closed.Load()), int(blocked.Load())
	res.Held = res.Opened - res.Closed
	for _, c := range conns {
		if err := context.Cause(c.Context()); err != nil && c.Context().Err() != nil {
			note("connection closed: " + shortErr(err))
		}
		_ = c.CloseWithError(0, "")
	}
}

// shortErr is the first line of err, without the stream or connection
// numbers that make every error distinct.
func shortErr(err error) string {
	if err == nil {
		return "EOF"
	}
	s := err.Error()
	if i := strings.IndexAny(s, "\n("); i > 0 {
		s = s[:i]
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return strings.TrimSpace(s)
}

// trickle sends an OpenAI request whose headers announce a 100 kB body
// and whose body comes one byte per o.interval, and reports after how
// many seconds the server closed the connection (-1: not within o.limit)
// and the status it answered, if any.
func trickle(ctx context.Context, o opts, res *result) {
	u, err := url.Parse(o.url)
	if err != nil {
		fail(err.Error())
	}
	host := u.Host
	var conn net.Conn
	d := &net.Dialer{Timeout: 5 * time.Second}
	if u.Scheme == "https" {
		pool := x509.NewCertPool()
		if o.cacert != "" {
			pem, err := os.ReadFile(o.cacert)
			if err != nil {
				fail(err.Error())
			}
			pool.AppendCertsFromPEM(pem)
		}
		conn, err = tls.DialWithDialer(d, "tcp", host, &tls.Config{RootCAs: pool, ServerName: u.Hostname()})
	} else {
		conn, err = d.Dial("tcp", host)
	}
	if err != nil {
		res.Attempts = append(res.Attempts, outcome("connect", err))
		res.ClosedAfter = -2
		return
	}
	defer conn.Close()
	const length = 100000
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		u.RequestURI(), host, o.key, length)
	t0 := time.Now()
	if _, err := conn.Write([]byte(head)); err != nil {
		res.Attempts = append(res.Attempts, outcome("headers", err))
		res.ClosedAfter = 0
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err == nil {
			res.AnsweredAfter = time.Since(t0).Seconds()
			res.Status = resp.StatusCode
			b := make([]byte, 512)
			n, _ := resp.Body.Read(b)
			res.Body = string(b[:n])
			// The connection may stay open after an answer; wait for its end.
			var rest [1]byte
			_, _ = conn.Read(rest[:])
		}
	}()
	body := `{"model":"tiny","messages":[{"role":"user","content":"` + strings.Repeat("a", length) // never completed
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	// finish closes the connection and waits for the reader: what it
	// recorded is then safe to print.
	finish := func(after float64) {
		_ = conn.Close()
		<-done
		res.ClosedAfter = after
	}
	for {
		select {
		case <-done:
			res.ClosedAfter = time.Since(t0).Seconds()
			return
		case <-ctx.Done():
			finish(-1)
			return
		case <-tick.C:
			if time.Since(t0) > o.limit {
				finish(-1)
				return
			}
			if res.Sent < len(body) {
				if _, err := conn.Write([]byte{body[res.Sent]}); err != nil {
					res.Attempts = append(res.Attempts, outcome("body byte", err))
					finish(time.Since(t0).Seconds())
					return
				}
				res.Sent++
			}
		}
	}
}
