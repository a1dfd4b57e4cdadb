package node

import (
	"context"
	"time"

	"shoal/node/identity"
)

// HTTPS of the agent's HTTP API: the certificate, its renewal and the
// cluster's HTTPS CA are node/identity's; this file wires them.

// HTTPSCAPath is where an agent whose data dir is dataDir keeps the
// cluster's HTTPS CA certificate: what clients of its API trust.
func HTTPSCAPath(dataDir string) string { return identity.HTTPSCAPath(dataDir) }

// setupHTTPS prepares the certificate of the HTTP API before it listens
// (identity.SetupHTTPS); a.https stays nil for plain HTTP.
func (a *Agent) setupHTTPS() error {
	if !a.cfg.HTTPSEnabled() {
		return nil
	}
	h, err := identity.SetupHTTPS(a.cfg.DataDir, a.cfg.TLSCert, a.cfg.TLSKey, a.log)
	if err != nil {
		return err
	}
	a.https = h
	return nil
}

// clusterCert reports whether the HTTPS certificate comes from the
// cluster's CA (not the operator).
func (a *Agent) clusterCert() bool { return a.https != nil && a.https.FromCluster() }

// httpsLoop gets the node's certificate from a server and renews it
// (identity.HTTPS.Loop).
func (a *Agent) httpsLoop() {
	defer a.bg.Done()
	a.https.Loop(a.done, identity.Signer{
		ID: a.id, Name: a.cfg.Name, Role: a.role, CertName: a.ident.Name, AdvIP: a.advIP, RPCAddr: a.RPCAddr,
		Sign: a.cluster.HTTPSCert,
	})
}

// httpsCALoop, on servers, writes the HTTPS CA certificate to the data
// dir once the state has it (identity.HTTPSCALoop).
func (a *Agent) httpsCALoop() {
	defer a.bg.Done()
	identity.HTTPSCALoop(a.done, a.srv, a.cfg.DataDir, a.log)
}

// awaitHTTPS waits up to d for the HTTPS certificate.
func (a *Agent) awaitHTTPS(ctx context.Context, d time.Duration) {
	if a.https != nil {
		a.https.Await(ctx, d)
	}
}
