package node

import (
	"net"
	"strconv"

	"shoal/coordinator"
	"shoal/node/identity"
)

// What an agent tells about itself: its ID and name, and the addresses of
// its API, QUIC endpoint and gossip.

// ID of the node.
func (a *Agent) ID() string { return a.id }

// Name of the node.
func (a *Agent) Name() string { return a.cfg.Name }

// Server is the coordinator (nil on clients).
func (a *Agent) Server() *coordinator.Server { return a.srv }

// HTTPAddr is where the admin API listens (loopback if bound to any).
func (a *Agent) HTTPAddr() string { return a.localAddr(a.httpLn.Addr().(*net.TCPAddr).Port) }

// HTTPURL is the base URL of the API: https://host:port or, on loopback
// or with --insecure-http, http://host:port.
func (a *Agent) HTTPURL() string {
	if a.https != nil {
		return "https://" + a.HTTPAddr()
	}
	return "http://" + a.HTTPAddr()
}

// HTTPS reports whether the API serves HTTPS.
func (a *Agent) HTTPS() bool { return a.https != nil }

// RPCAddr is the advertised QUIC address.
func (a *Agent) RPCAddr() string { return net.JoinHostPort(a.advIP, strconv.Itoa(a.ep.Addr().Port)) }

// GossipAddr is the advertised gossip address.
func (a *Agent) GossipAddr() string {
	n := a.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

func (a *Agent) localAddr(port int) string {
	host := a.cfg.Bind
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// Device says what runs this node's layers (--device) and, on the CPU
// under auto, why no GPU does.
func (a *Agent) Device() string { return a.devLine }

// NodeID is the ID of the agent whose data dir is dataDir, made and kept
// there when the dir has none yet (what the agent does at start).
func NodeID(dataDir string) (string, error) { return identity.LoadNodeID(dataDir) }
