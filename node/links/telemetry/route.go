package telemetry

import (
	"fmt"
	"net/netip"
	"slices"
)

// Interfaces returns the interfaces that route to the given peers, sorted
// and without repeats: the ones to Attach so that the cluster's traffic is
// counted (InterfaceFor gives the one for each peer).
func Interfaces(peers []netip.Addr) ([]string, error) {
	var names []string
	for _, p := range peers {
		name, err := InterfaceFor(p)
		if err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

func checkPeer(peer netip.Addr) error {
	if !peer.IsValid() || peer.IsUnspecified() {
		return fmt.Errorf("telemetry: no route to invalid peer address %v", peer)
	}
	return nil
}
