package transporttest

import (
	"testing"
	"time"

	"shoal/transport"
)

// CA is the certificate authority derived from secret; it panics when
// the derivation fails (a test's secret is a constant, at least as long
// as transport.DeriveCA asks).
func CA(secret string) *transport.CA {
	ca, err := transport.DeriveCA(secret)
	if err != nil {
		panic(err)
	}
	return ca
}

// Listen opens an endpoint on 127.0.0.1 (a port the system picks) with a
// server certificate for node from ca; it fails t when either fails. The
// caller closes the endpoint.
func Listen(t testing.TB, ca *transport.CA, node string) *transport.Endpoint {
	t.Helper()
	id, err := transport.SelfIssue(ca, node, transport.RoleServer)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := transport.Listen(transport.Config{Bind: "127.0.0.1:0", Identity: id, HandshakeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return ep
}
