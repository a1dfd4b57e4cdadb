package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"shoal/coordinator"
)

// DefaultName is the name of an agent started without --name: the host
// name made a node name (see nodeName).
func DefaultName() string {
	h, _ := os.Hostname()
	return nodeName(h)
}

// nodeName makes a host name a node name (coordinator.CheckNodeName): a
// name longer than a node name may be is cut to its first label, every
// character a name may not hold becomes '-', leading punctuation goes,
// and what is left is cut to the limit ("node" if nothing is left).
func nodeName(host string) string {
	if len(host) > coordinator.MaxNodeNameLen {
		if i := strings.IndexByte(host, '.'); i > 0 {
			host = host[:i]
		}
	}
	b := []byte(host)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '-'
		}
	}
	name := strings.TrimLeft(string(b), "._-")
	if len(name) > coordinator.MaxNodeNameLen {
		name = name[:coordinator.MaxNodeNameLen]
	}
	if name == "" {
		return "node"
	}
	return name
}

// DefaultQUICPort is used for --join addresses without a port.
const DefaultQUICPort = 7947

// JoinAddr is a --join address with the default port when it has none.
func JoinAddr(s string) (string, error) {
	if s == "" {
		return "", errors.New("--join address is empty")
	}
	if _, _, err := net.SplitHostPort(s); err == nil {
		return s, nil
	}
	if strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "[") { // bare IPv6
		return net.JoinHostPort(s, fmt.Sprint(DefaultQUICPort)), nil
	}
	if strings.Contains(s, ":") {
		return "", fmt.Errorf("--join %q: want host or host:port", s)
	}
	return net.JoinHostPort(s, fmt.Sprint(DefaultQUICPort)), nil
}
