//go:build !linux

package telemetry

import (
	"fmt"
	"net"
	"net/netip"
)

// InterfaceFor returns the name of the interface that holds the local
// address the system would send to peer from. It connects a UDP socket
// (which sends nothing) to learn that address, then looks it up among the
// interfaces. A peer address of this host gives the interface holding it.
func InterfaceFor(peer netip.Addr) (string, error) {
	if err := checkPeer(peer); err != nil {
		return "", err
	}
	peer = peer.Unmap()
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, 9)))
	if err != nil {
		return "", fmt.Errorf("telemetry: route to %v: %w", peer, err)
	}
	local := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	c.Close()
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("telemetry: route to %v: %w", peer, err)
	}
	for _, ifc := range ifaces {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == local {
					return ifc.Name, nil
				}
			}
		}
	}
	return "", fmt.Errorf("telemetry: route to %v: no interface holds local address %v", peer, local)
}
