package identity

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/zap"

	"shoal/internal/version"
	"shoal/transport"
)

// TestJoinNameChecked: a server's join handler refuses a join request
// whose name fails coordinator.CheckNodeName ("\x1b[31m", "\n") with a 400
// that gives the reason, before the token is even looked at.
func TestJoinNameChecked(t *testing.T) {
	ca, err := transport.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	ident, err := transport.SelfIssue(ca, "server-1", transport.RoleServer)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := transport.Listen(transport.Config{Bind: "127.0.0.1:0", Identity: ident})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	j := NewAdmission(AdmissionConfig{Name: "server-1", Log: zap.NewNop()})
	ep.Handle(transport.KindJoin, j.Serve)
	for _, name := range []string{"evil\x1b[31m", "a\nb"} {
		req, _ := json.Marshal(joinRequest{Token: "abc123.0123456789abcdef", NodeID: strings.Repeat("1", 36), Name: name, Role: "client", PublicKey: make([]byte, 32)})
		resp, err := joinOnce(t.Context(), ep.Addr().String(), transport.CAHash(ident.CA.Cert), req, version.This, "")
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code != http.StatusBadRequest || !strings.Contains(resp.Err, "node name") || !strings.Contains(resp.Err, "--name") {
			t.Fatalf("join as %q: %d %q, want a 400 about the name", name, resp.Code, resp.Err)
		}
		t.Logf("join as %q: %d %s", name, resp.Code, resp.Err)
	}
}
