package coordinator

import (
	"fmt"
	"strings"
)

// MaxNodeNameLen bounds a node name: it is a DNS label in the node's HTTPS
// certificate and a column in every listing.
const MaxNodeNameLen = 63

// CheckNodeName reports why name cannot name a node, or nil: 1 to 63
// characters of letters, digits, '.', '_' and '-', starting with a letter
// or digit. Names reach logs, terminals, certificates and file names, so
// control characters, spaces, quotes and slashes are refused everywhere a
// name enters the cluster (the agent's --name, a join request, a command
// in the Raft log).
func CheckNodeName(name string) error {
	return checkName("node name", name, MaxNodeNameLen, "._-")
}

// checkName checks a name of what: 1 to max bytes of ASCII letters and
// digits, and after the first byte also the bytes of punct.
func checkName(what, name string, max int, punct string) error {
	if name == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(name) > max {
		return fmt.Errorf("%s %.20q... is %d bytes long, limit %d", what, name, len(name), max)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || i > 0 && strings.IndexByte(punct, c) >= 0
		if !ok {
			return fmt.Errorf("%s %.40q: use letters, digits, %s, starting with a letter or digit", what, name, quoteEach(punct))
		}
	}
	return nil
}

// quoteEach lists the bytes of s as '.', '_' and '-'.
func quoteEach(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case i == 0:
		case i == len(s)-1:
			b.WriteString(" and ")
		default:
			b.WriteString(", ")
		}
		b.WriteString("'" + s[i:i+1] + "'")
	}
	return b.String()
}
