package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/transport"
)

// HTTPS of the agent's HTTP API. Agents serve HTTPS unless they listen on
// loopback only, with a certificate the cluster's HTTPS CA signs for the
// node's name and addresses (or the operator's --tls-cert). The CA is
// ECDSA P-256, made by the first leader (ensureHTTPSCA); the node keeps
// its key in the data dir and asks a server to sign it (Cluster.HTTPSCert).

// Files in the data dir's tls/ folder.
const (
	httpsCAFile   = "https-ca.pem"
	httpsCertFile = "https.pem"
	httpsKeyFile  = "https-key.pem"
)

// HTTPS modes of Config.HTTPS.
const (
	HTTPSAuto = "auto" // HTTPS unless bound to a loopback address (the default)
	HTTPSOn   = "on"   // HTTPS even on loopback
	HTTPSOff  = "off"  // plain HTTP even on a network address (--insecure-http)
)

// renewBefore is how long before its expiry a certificate is replaced.
const renewBefore = 30 * 24 * time.Hour

// HTTPSCAPath is where an agent whose data dir is dataDir keeps the
// cluster's HTTPS CA certificate: what clients of its API trust.
func HTTPSCAPath(dataDir string) string { return filepath.Join(dataDir, "tls", httpsCAFile) }

// HTTPSEnabled reports whether the HTTP API serves HTTPS.
func (c *Config) HTTPSEnabled() bool {
	switch {
	case c.TLSCert != "":
		return true
	case c.HTTPS == HTTPSOn:
		return true
	case c.HTTPS == HTTPSOff:
		return false
	}
	ip := net.ParseIP(c.Bind)
	return ip == nil || !ip.IsLoopback() // no --bind, or 0.0.0.0, is the network
}

// httpsCert is the certificate the HTTPS server presents; it may arrive
// after the server has started.
type httpsCert struct {
	log      *zap.Logger
	mu       sync.Mutex
	cert     *tls.Certificate
	ready    chan struct{} // closed when the first certificate is set
	lastWarn time.Time
}

func newHTTPSCert(log *zap.Logger) *httpsCert {
	return &httpsCert{log: log, ready: make(chan struct{})}
}

// get is tls.Config.GetCertificate.
func (h *httpsCert) get(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cert == nil {
		if time.Since(h.lastWarn) > 10*time.Second {
			h.lastWarn = time.Now()
			h.log.Warn("refusing an HTTPS connection: this agent has no certificate yet (it is waiting for a cluster server to sign one)",
				zap.Stringer("from", hello.Conn.RemoteAddr()))
		}
		return nil, errors.New("no HTTPS certificate yet: the agent is waiting for the cluster to sign one")
	}
	return h.cert, nil
}

func (h *httpsCert) set(c *tls.Certificate) {
	h.mu.Lock()
	first := h.cert == nil
	h.cert = c
	h.mu.Unlock()
	if first {
		close(h.ready)
	}
}

func (h *httpsCert) current() *tls.Certificate {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cert
}

// setupHTTPS prepares the certificate of the HTTP API before it listens:
// the operator's, or the one the cluster signed earlier (a restart serves
// at once). Without one, httpsLoop gets it.
func (a *Agent) setupHTTPS() error {
	if !a.cfg.HTTPSEnabled() {
		return nil
	}
	a.https = newHTTPSCert(a.log)
	if a.cfg.TLSCert != "" {
		c, err := tls.LoadX509KeyPair(a.cfg.TLSCert, a.cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		a.https.set(&c)
		return nil
	}
	dir := filepath.Join(a.cfg.DataDir, "tls")
	if c, err := loadHTTPSCert(dir); err == nil {
		a.https.set(c)
	}
	return nil
}

// clusterCert reports whether the HTTPS certificate comes from the
// cluster's CA (not the operator).
func (a *Agent) clusterCert() bool { return a.https != nil && a.cfg.TLSCert == "" }

// httpsLoop gets the node's certificate from a server and renews it when
// it nears its expiry or no longer names the node's address.
func (a *Agent) httpsLoop() {
	defer a.bg.Done()
	dir := filepath.Join(a.cfg.DataDir, "tls")
	key, err := loadOrCreateHTTPSKey(dir)
	if err != nil {
		a.log.Error("HTTPS key: the API will refuse HTTPS connections", zap.Error(err))
		return
	}
	backoff := 200 * time.Millisecond
	var failing time.Time
	for {
		wait := time.Hour
		if c := a.https.current(); c == nil || a.renewHTTPS(c.Leaf) {
			err := a.requestHTTPSCert(dir, key)
			switch {
			case err == nil:
				backoff = 200 * time.Millisecond
				failing = time.Time{}
			case failing.IsZero() || time.Since(failing) > 30*time.Second:
				failing = time.Now()
				a.log.Info("no HTTPS certificate yet; retrying", zap.Error(err))
				fallthrough
			default:
				wait = backoff
				// Without a certificate the API refuses every client:
				// ask again soon; a renewal can wait longer.
				limit := 5 * time.Second
				if a.https.current() == nil {
					limit = time.Second
				}
				backoff = min(2*backoff, limit)
			}
		}
		select {
		case <-a.done:
			return
		case <-time.After(wait):
		}
	}
}

// renewHTTPS reports whether leaf should be replaced: it expires within
// renewBefore, or it does not name the node's current name or address.
func (a *Agent) renewHTTPS(leaf *x509.Certificate) bool {
	if leaf == nil || time.Until(leaf.NotAfter) < renewBefore {
		return true
	}
	if a.advIP != "" && leaf.VerifyHostname(a.advIP) != nil {
		return true
	}
	names := map[string]bool{}
	for _, n := range leaf.DNSNames {
		names[n] = true
	}
	dns, _, _ := coordinator.HTTPSNames(a.id, a.cfg.Name, "", nil)
	for _, n := range dns {
		if !names[n] {
			return true
		}
	}
	return false
}

// requestHTTPSCert asks the cluster to sign key and installs the answer.
func (a *Agent) requestHTTPSCert(dir string, key *ecdsa.PrivateKey) error {
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := a.cluster.HTTPSCert(ctx, coordinator.Peer{ID: a.id, Role: a.role, Name: a.ident.Name, Addr: a.RPCAddr()}, pub)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(resp.CA)
	if err != nil {
		return fmt.Errorf("HTTPS CA certificate: %w", err)
	}
	c, err := httpsChain(resp.Cert, resp.CA, caCert, key)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, httpsCAFile), pemCert(resp.CA), 0o644); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, httpsCertFile), pemCert(resp.Cert), 0o644); err != nil {
		return err
	}
	a.https.set(c)
	a.log.Info("HTTPS certificate issued by the cluster", zap.Strings("dns", c.Leaf.DNSNames),
		zap.Stringers("ips", c.Leaf.IPAddresses), zap.Time("expires", c.Leaf.NotAfter),
		zap.String("ca", filepath.Join(dir, httpsCAFile)))
	return nil
}

// httpsChain checks that leaf is caCert's and for key, and builds what the
// server presents.
func httpsChain(leafDER, caDER []byte, caCert *x509.Certificate, key *ecdsa.PrivateKey) (*tls.Certificate, error) {
	leaf, err := x509.ParseCertificate(leafDER)
	if err != nil {
		return nil, fmt.Errorf("HTTPS certificate: %w", err)
	}
	if err := leaf.CheckSignatureFrom(caCert); err != nil {
		return nil, fmt.Errorf("HTTPS certificate is not signed by the HTTPS CA: %w", err)
	}
	if pk, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pk.Equal(key.Public()) {
		return nil, errors.New("HTTPS certificate is not for this node's key")
	}
	return &tls.Certificate{Certificate: [][]byte{leafDER, caDER}, PrivateKey: key, Leaf: leaf}, nil
}

// loadHTTPSCert reads the certificate the cluster signed earlier.
func loadHTTPSCert(dir string) (*tls.Certificate, error) {
	keyDER, err := readPEMFile(filepath.Join(dir, httpsKeyFile))
	if err != nil {
		return nil, err
	}
	k, err := x509.ParseECPrivateKey(keyDER)
	if err != nil {
		return nil, err
	}
	leafDER, err := readPEMFile(filepath.Join(dir, httpsCertFile))
	if err != nil {
		return nil, err
	}
	caDER, err := readPEMFile(filepath.Join(dir, httpsCAFile))
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	return httpsChain(leafDER, caDER, caCert, k)
}

// loadOrCreateHTTPSKey reads the node's HTTPS key, making it (0600) on
// first use. It never leaves the node.
func loadOrCreateHTTPSKey(dir string) (*ecdsa.PrivateKey, error) {
	path := filepath.Join(dir, httpsKeyFile)
	if der, err := readPEMFile(path); err == nil {
		return x509.ParseECPrivateKey(der)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return k, writeFileAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// ensureHTTPSCA creates the cluster's HTTPS CA on the first leader.
func (a *Agent) ensureHTTPSCA() {
	var have *coordinator.HTTPSCA
	a.srv.FSM().View(func(st *coordinator.State) { have = st.HTTPSCA })
	if have == nil {
		ca, err := coordinator.NewHTTPSCA()
		if err != nil {
			a.log.Error("creating the HTTPS CA", zap.Error(err))
			return
		}
		err = a.srv.Apply(coordinator.HTTPSCASetType|coordinator.IgnoreUnknownTypeFlag, coordinator.HTTPSCASetRequest{CA: *ca}, 5*time.Second)
		if err != nil && transport.StatusOf(err) != http.StatusConflict {
			a.log.Warn("storing the HTTPS CA", zap.Error(err))
			return
		}
		a.log.Info("created the cluster's HTTPS CA")
	}
}

// httpsCALoop, on servers, writes the HTTPS CA certificate to the data
// dir once the state has it, whether or not this agent serves HTTPS.
func (a *Agent) httpsCALoop() {
	defer a.bg.Done()
	for !a.writeHTTPSCA() {
		select {
		case <-a.done:
			return
		case <-a.srv.FSM().Changed():
		}
	}
}

// writeHTTPSCA writes the HTTPS CA certificate from this server's state
// to its data dir, so operators find it on every server (nodes serving
// HTTPS write it when their certificate arrives). It reports whether the
// file is there.
func (a *Agent) writeHTTPSCA() bool {
	var pemCA string
	a.srv.FSM().View(func(st *coordinator.State) {
		if st.HTTPSCA != nil {
			pemCA = st.HTTPSCA.CertPEM
		}
	})
	if pemCA == "" {
		return false
	}
	path := HTTPSCAPath(a.cfg.DataDir)
	if b, err := os.ReadFile(path); err == nil && string(b) == pemCA {
		return true
	}
	if err := writeFileAtomic(path, []byte(pemCA), 0o644); err != nil {
		a.log.Warn("writing the HTTPS CA certificate", zap.Error(err))
		return false
	}
	return true
}

// awaitHTTPS waits up to d for the HTTPS certificate.
func (a *Agent) awaitHTTPS(ctx context.Context, d time.Duration) {
	if a.https == nil {
		return
	}
	select {
	case <-a.https.ready:
	case <-ctx.Done():
	case <-time.After(d):
		a.log.Warn("no HTTPS certificate yet: the API refuses connections until a server signs one")
	}
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func readPEMFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	return blk.Bytes, nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
