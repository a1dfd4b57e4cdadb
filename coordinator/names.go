package coordinator

import "fmt"

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
	if name == "" {
		return fmt.Errorf("node name is empty")
	}
	if len(name) > MaxNodeNameLen {
		return fmt.Errorf("node name %.20q... is %d bytes long, limit %d", name, len(name), MaxNodeNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			i > 0 && (c == '.' || c == '_' || c == '-')
		if !ok {
			return fmt.Errorf("node name %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", name)
		}
	}
	return nil
}
