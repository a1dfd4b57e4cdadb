package coordinator

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestHTTPSCertForCaller: a server signs a node's HTTPS certificate with
// the cluster's HTTPS CA for the names and addresses the cluster knows that
// node by, whatever else the request says; an unknown node gets none; a
// client node's copy of the state has the CA certificate but not its key;
// the CA is set once.
func TestHTTPSCertForCaller(t *testing.T) {
	c := newTestCluster(t)
	c.add(1)
	leader := c.leader(10 * time.Second)
	cl := NewClient(leader.srv, c.members, &memCaller{clients: map[string]*Client{}}, zap.NewNop())
	ctx := context.Background()

	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pub, _ := x509.MarshalPKIXPublicKey(key.Public())
	// The request names another node's name and address: both are ignored.
	forged, _ := json.Marshal(map[string]any{"public_key": pub, "dns_names": []string{"victim"}, "ips": []string{"127.0.0.8"}})
	self := Peer{ID: "client-node", Role: RoleClient}
	if _, err := cl.Handle(ctx, self, MethodHTTPSCert, forged); StatusCode(err) != http.StatusServiceUnavailable {
		t.Fatalf("a certificate before the cluster has an HTTPS CA: %v", err)
	}

	ca, err := NewHTTPSCA()
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Apply(ctx, HTTPSCASetType|IgnoreUnknownTypeFlag, HTTPSCASetRequest{CA: *ca}); err != nil {
		t.Fatal(err)
	}
	other, _ := NewHTTPSCA()
	if err := cl.Apply(ctx, HTTPSCASetType|IgnoreUnknownTypeFlag, HTTPSCASetRequest{CA: *other}); StatusCode(err) != http.StatusConflict {
		t.Fatalf("a second HTTPS CA: %v, want a conflict", err)
	}

	if _, err := cl.Handle(ctx, self, MethodHTTPSCert, forged); StatusCode(err) != http.StatusServiceUnavailable {
		t.Fatalf("a certificate for a node the cluster does not know: %v", err)
	}
	// The node's certificate names it; it asks from 127.0.0.7. Gossip
	// calling it "victim", at another node's address, changes nothing.
	self = Peer{ID: "client-node", Name: "client-node", Role: RoleClient, Addr: "127.0.0.7:50123"}
	c.members.set(Member{ID: "client-node", Name: "victim", Role: RoleServer, Addr: "127.0.0.8:7946", RPCAddr: "127.0.0.8:7947", Status: StatusAlive})
	c.members.set(Member{ID: "victim-id", Name: "victim", Role: RoleClient, Addr: "127.0.0.8:7946", RPCAddr: "127.0.0.8:7947", Status: StatusAlive})

	res, err := cl.Handle(ctx, self, MethodHTTPSCert, forged)
	if err != nil {
		t.Fatal(err)
	}
	resp := res.(*HTTPSCertResponse)
	leaf, err := x509.ParseCertificate(resp.Cert)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _, err := ca.Cert()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	for _, name := range []string{"client-node", "localhost", "127.0.0.7", "127.0.0.1", "::1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("certificate does not verify for %s: %v", name, err)
		}
	}
	for _, name := range []string{"victim", "127.0.0.8"} {
		if err := leaf.VerifyHostname(name); err == nil {
			t.Errorf("certificate names %s, another node's", name)
		}
	}
	if d := time.Until(leaf.NotAfter); d < 300*24*time.Hour || d > 400*24*time.Hour {
		t.Errorf("certificate valid for %v, want about a year", d)
	}
	if _, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !leaf.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) {
		t.Error("certificate is not for the requested key")
	}

	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	edDER, _ := x509.MarshalPKIXPublicKey(edPub)
	b, _ := json.Marshal(HTTPSCertRequest{PublicKey: edDER})
	if _, err := cl.Handle(ctx, self, MethodHTTPSCert, b); StatusCode(err) != http.StatusBadRequest {
		t.Errorf("an Ed25519 key: %v, want a bad request", err)
	}

	st, err := cl.Handle(ctx, self, MethodState, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h := st.(*State).HTTPSCA; h == nil || h.CertPEM != ca.CertPEM || h.KeyPEM != "" {
		t.Errorf("a client node's state copy has HTTPS CA %+v: want the certificate without the key", h)
	}
	st, err = cl.Handle(ctx, Peer{ID: leader.id, Role: RoleServer}, MethodState, nil)
	if err != nil || st.(*State).HTTPSCA == nil || st.(*State).HTTPSCA.KeyPEM != ca.KeyPEM {
		t.Errorf("a server's state copy lacks the HTTPS CA key: %v", err)
	}
	if leader.srv.FSM().State().HTTPSCA.KeyPEM == "" {
		t.Error("redacting changed the state")
	}
}
