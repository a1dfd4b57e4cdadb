//go:build unix

package transport

import (
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

// pollConn is a TCP connection whose reads can poll the socket for a while
// before parking the goroutine in the runtime's poller: a reader that
// expects an answer within microseconds gets it without the wake-up of a
// parked goroutine.
type pollConn struct {
	*net.TCPConn
	raw  syscall.RawConn
	poll atomic.Int64 // nanoseconds a read polls before it parks; 0: it parks at once

	// One read at a time (the connection has one reader): its state, for
	// fn, bound once so that a read allocates nothing.
	b     []byte
	n     int
	err   error
	start time.Time
	wait  time.Duration
	fn    func(fd uintptr) bool

	// While corked (by its one writer), writes gather in wbuf and go to
	// the socket in one write at flush: a frame of many TLS records costs
	// one system call, not one per record.
	corked bool
	wbuf   []byte
}

// cork makes the following writes gather until flush.
func (p *pollConn) cork() { p.corked, p.wbuf = true, p.wbuf[:0] }

// flush writes what gathered since cork and ends the cork.
func (p *pollConn) flush() error {
	p.corked = false
	if len(p.wbuf) == 0 {
		return nil
	}
	_, err := p.TCPConn.Write(p.wbuf)
	if cap(p.wbuf) > 8<<20 {
		p.wbuf = nil
	}
	p.wbuf = p.wbuf[:0]
	return err
}

func (p *pollConn) Write(b []byte) (int, error) {
	if p.corked {
		p.wbuf = append(p.wbuf, b...)
		return len(b), nil
	}
	return p.TCPConn.Write(b)
}

func newPollConn(c *net.TCPConn) *pollConn {
	p := &pollConn{TCPConn: c}
	if raw, err := c.SyscallConn(); err == nil {
		p.raw = raw
	}
	p.fn = p.try
	return p
}

// setPoll sets how long the following reads poll.
func (p *pollConn) setPoll(d time.Duration) { p.poll.Store(int64(d)) }

// try reads what the socket holds; while it holds nothing, it polls until
// p.wait has passed since the read began (false: park until readable).
func (p *pollConn) try(fd uintptr) bool {
	for {
		p.n, p.err = syscall.Read(int(fd), p.b)
		switch {
		case p.err == syscall.EINTR:
			continue
		case p.err == syscall.EAGAIN:
			if p.wait > 0 && time.Since(p.start) < p.wait {
				// Let the process's other goroutines run meanwhile.
				// (Yielding the thread to the OS as well made calls
				// between two processes on one host slower, not faster.)
				runtime.Gosched()
				continue
			}
			p.wait = 0
			return false
		}
		return true
	}
}

func (p *pollConn) Read(b []byte) (int, error) {
	d := time.Duration(p.poll.Load())
	if d <= 0 || p.raw == nil || len(b) == 0 {
		return p.TCPConn.Read(b)
	}
	p.b, p.wait, p.start = b, d, time.Now()
	err := p.raw.Read(p.fn)
	n, rerr := p.n, p.err
	p.b = nil
	if err != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: p.LocalAddr(), Addr: p.RemoteAddr(), Err: err}
	}
	if rerr != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: p.LocalAddr(), Addr: p.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	}
	if n <= 0 {
		return 0, io.EOF
	}
	return n, nil
}
