package nodeaddr

import "strings"

// Tag is the address of node id at addr (host:port).
func Tag(id, addr string) string {
	if id == "" {
		return addr
	}
	return id + "@" + addr
}

// Split undoes Tag; a plain host:port has no ID.
func Split(a string) (id, addr string) {
	if i := strings.LastIndexByte(a, '@'); i >= 0 {
		return a[:i], a[i+1:]
	}
	return "", a
}
