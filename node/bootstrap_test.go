package node_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"shoal/api"
	tc "shoal/node/nodetest"
	"shoal/transport"
)

// TestBootstrapSecretDerivesNothing: servers that bootstrap together agree
// on one random CA and gossip key (neither derivable from the secret); the
// secret admits more nodes only until it is revoked, and a wrong secret is
// refused at once.
func TestBootstrapSecretDerivesNothing(t *testing.T) {
	c := tc.New(t, 3)
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)

	derived, _ := transport.DeriveCA(tc.Secret)
	var cas []string
	for _, m := range c.Members {
		ident, err := transport.LoadIdentity(filepath.Join(m.Cfg.DataDir, "tls"))
		if err != nil {
			t.Fatal(err)
		}
		cas = append(cas, transport.CAHash(ident.CA.Cert))
		if ident.CA.Key == nil {
			t.Errorf("%s holds no CA key", m.Cfg.Name)
		}
		gk, _ := os.ReadFile(filepath.Join(m.Cfg.DataDir, "tls", "gossip.key"))
		if bytes.Equal(gk, transport.DeriveGossipKey(tc.Secret)) {
			t.Errorf("%s: the gossip key is derived from the bootstrap secret", m.Cfg.Name)
		}
	}
	if cas[0] != cas[1] || cas[1] != cas[2] {
		t.Fatalf("the servers bootstrapped different CAs: %v", cas)
	}
	if cas[0] == transport.CAHash(derived.Cert) {
		t.Fatal("the cluster CA is derived from the bootstrap secret")
	}

	start := time.Now()
	_, err := c.Add("wrong-secret", true, "not-the-cluster-secret-0123")
	if err == nil || !strings.Contains(err.Error(), "not this cluster's bootstrap secret") {
		t.Fatalf("wrong secret: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the wrong secret was refused after %v", d)
	}

	// While valid, the secret admits a client (which keeps no CA key).
	m, err := c.Add("late-client", false, tc.Secret)
	if err != nil {
		t.Fatal(err)
	}
	ident, err := transport.LoadIdentity(filepath.Join(m.Cfg.DataDir, "tls"))
	if err != nil {
		t.Fatal(err)
	}
	if transport.CAHash(ident.CA.Cert) != cas[0] || ident.CA.Key != nil || ident.Role != transport.RoleClient {
		t.Fatalf("late client: CA %s (cluster %s), holds CA key %v, role %s", transport.CAHash(ident.CA.Cert), cas[0], ident.CA.Key != nil, ident.Role)
	}

	admin, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{Kind: api.TokenAdmin})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Client(0, admin.Secret).RevokeToken(ctx(t), "bootstrap"); err != nil {
		t.Fatal(err)
	}
	// Every server's copy of the state says so (the poll asks member 0).
	tc.Eventually(t, 5*time.Second, "the revocation on every server", func() bool {
		for _, m := range c.Members[:3] {
			if !m.Agent.Server().FSM().State().Tokens["bootstrap"].Revoked {
				return false
			}
		}
		return true
	})
	for _, role := range []bool{true, false} {
		start := time.Now()
		_, err := c.Add("after-revoke", role, tc.Secret)
		if err == nil || !strings.Contains(err.Error(), "bootstrap secret was revoked") {
			t.Fatalf("server %v after revoking the bootstrap secret: %v", role, err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("refused after %v", d)
		}
	}
	if _, err := c.Client(0, tc.Secret).Nodes(ctx(t)); err == nil {
		t.Error("the revoked bootstrap secret still works as an API key")
	}
	// The late client is in the state once the leader registered it from
	// gossip (a moment, longer on a loaded machine).
	var s *api.Status
	tc.Eventually(t, 15*time.Second, "the cluster with its 4 nodes after the refusals", func() bool {
		s, err = c.Client(1, admin.Secret).Status(ctx(t))
		return err == nil && s.Nodes == 4
	})
}
