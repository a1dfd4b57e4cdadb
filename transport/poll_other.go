//go:build !unix

package transport

import (
	"net"
	"time"
)

// pollConn is a TCP connection; on this platform its reads park at once.
type pollConn struct{ *net.TCPConn }

func newPollConn(c *net.TCPConn) *pollConn { return &pollConn{TCPConn: c} }

func (p *pollConn) setPoll(time.Duration) {}

func (p *pollConn) cork()        {}
func (p *pollConn) flush() error { return nil }
