package transport

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"shoal/internal/nodeaddr"
)

// RaftLayer is a raft.StreamLayer over streams of kind KindRaft. Raft
// server addresses are the QUIC addresses of the servers' endpoints.
type RaftLayer struct {
	ep        *Endpoint
	advertise net.Addr
	ch        chan net.Conn
	closeOnce sync.Once
	done      chan struct{}
}

var _ raft.StreamLayer = (*RaftLayer)(nil)

// NewRaftLayer registers the raft stream handler on ep. advertise is the
// address other servers reach this one at.
func NewRaftLayer(ep *Endpoint, advertise net.Addr) *RaftLayer {
	l := &RaftLayer{ep: ep, advertise: advertise, ch: make(chan net.Conn), done: make(chan struct{})}
	ep.Handle(KindRaft, func(s *Stream) {
		select {
		case l.ch <- s:
		case <-l.done:
			s.Close()
		}
	})
	return l
}

// Accept implements net.Listener.
func (l *RaftLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener. It does not close the endpoint.
func (l *RaftLayer) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener; raft uses it as this server's address.
func (l *RaftLayer) Addr() net.Addr { return l.advertise }

// Dial implements raft.StreamLayer. The peer must present a server-role
// certificate, and the certificate of the node the address names when it
// has the form internal/nodeaddr makes (ID@host:port): a Raft stream carries the
// log (token hashes, the HTTPS CA key), so it goes only to the server it
// is meant for, whatever gossip says lives at that address.
func (l *RaftLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	id, addr := nodeaddr.Split(string(address))
	return l.ep.DialAs(ctx, addr, KindRaft, id, RoleServer)
}
