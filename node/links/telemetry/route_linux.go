//go:build linux

package telemetry

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// InterfaceFor returns the name of the interface the kernel routes packets
// to peer through (the output interface of `ip route get`), in the calling
// thread's network namespace. A peer address of this host routes through
// "lo".
func InterfaceFor(peer netip.Addr) (string, error) {
	if err := checkPeer(peer); err != nil {
		return "", err
	}
	ip := net.IP(peer.Unmap().AsSlice())
	routes, err := netlink.RouteGet(ip)
	if err != nil {
		return "", fmt.Errorf("telemetry: route to %v: %w", peer, err)
	}
	if len(routes) == 0 || routes[0].LinkIndex == 0 {
		return "", fmt.Errorf("telemetry: no route to %v", peer)
	}
	l, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", fmt.Errorf("telemetry: route to %v: interface %d: %w", peer, routes[0].LinkIndex, err)
	}
	return l.Attrs().Name, nil
}
