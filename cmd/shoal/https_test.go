package main

import (
	"strings"
	"testing"

	"shoal/node"
	tc "shoal/node/nodetest"
)

// TestStatusOverHTTPS: the CLI talks to an agent over HTTPS when it trusts
// the cluster's HTTPS CA (SHOAL_CACERT or --cacert; a bare host:port then
// means https), and without the CA, or with http:// to an HTTPS agent,
// says what to do.
func TestStatusOverHTTPS(t *testing.T) {
	c := tc.NewWith(t, 1, func(i int, cfg *node.Config) { cfg.HTTPS = node.HTTPSOn })
	a := c.Members[0].Agent
	ca := node.HTTPSCAPath(c.Members[0].Cfg.DataDir)
	t.Setenv("SHOAL_ADDR", "")
	t.Setenv("SHOAL_DATA_DIR", "")
	t.Setenv("SHOAL_TOKEN", tc.Secret)

	t.Setenv("SHOAL_CACERT", ca)
	out, err := execute(t, "", "status", "--addr", a.HTTPURL())
	if err != nil || !strings.Contains(out, "server-0") || !strings.Contains(out, "Leader:") {
		t.Fatalf("status with SHOAL_CACERT: %v\n%s", err, out)
	}
	if out, err := execute(t, "", "node", "ls", "--addr", a.HTTPAddr()); err != nil || !strings.Contains(out, "server-0") {
		t.Fatalf("node ls at host:port with SHOAL_CACERT (https): %v\n%s", err, out)
	}

	t.Setenv("SHOAL_CACERT", "")
	if out, err := execute(t, "", "status", "--addr", a.HTTPAddr(), "--cacert", ca); err != nil || !strings.Contains(out, "server-0") {
		t.Fatalf("status with --cacert: %v\n%s", err, out)
	}
	_, err = execute(t, "", "status", "--addr", a.HTTPURL())
	if err == nil || !strings.Contains(err.Error(), "SHOAL_CACERT") || !strings.Contains(err.Error(), "tls/https-ca.pem") {
		t.Fatalf("status without the CA: %v, want a hint to set SHOAL_CACERT", err)
	}
	t.Logf("without the CA: %v", err)
	_, err = execute(t, "", "status", "--addr", "http://"+a.HTTPAddr())
	if err == nil || !strings.Contains(err.Error(), "serves HTTPS") {
		t.Fatalf("status over plain HTTP to an HTTPS agent: %v", err)
	}
	t.Logf("plain HTTP: %v", err)
}
