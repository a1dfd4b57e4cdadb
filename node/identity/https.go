package identity

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
// ECDSA P-256, made by the first leader (EnsureHTTPSCA); the node keeps
// its key in the data dir and asks a server to sign it (Cluster.HTTPSCert).

// Files in the data dir's tls/ folder.
const (
	httpsCAFile   = "https-ca.pem"
	httpsCertFile = "https.pem"
	httpsKeyFile  = "https-key.pem"
)

// renewBefore is how long before its expiry a certificate is replaced.
const renewBefore = 30 * 24 * time.Hour

// HTTPSCAPath is where an agent whose data dir is dataDir keeps the
// cluster's HTTPS CA certificate: what clients of its API trust.
func HTTPSCAPath(dataDir string) string { return filepath.Join(dataDir, "tls", httpsCAFile) }

// HTTPS is the certificate the agent's HTTPS server presents: the
// operator's (--tls-cert), or the one the cluster's HTTPS CA signs, which
// may arrive after the server has started.
type HTTPS struct {
	log      *zap.Logger
	dir      string // the data dir's tls/ folder
	operator bool   // the operator's certificate: never renewed
	mu       sync.Mutex
	cert     *tls.Certificate
	ready    chan struct{} // closed when the first certificate is set
	lastWarn time.Time
}

// SetupHTTPS prepares the certificate of the HTTP API before it listens:
// the operator's (tlsCert and tlsKey, when given), or the one the cluster
// signed earlier (a restart serves at once). Without one, Loop gets it.
func SetupHTTPS(dataDir, tlsCert, tlsKey string, log *zap.Logger) (*HTTPS, error) {
	h := &HTTPS{log: log, dir: filepath.Join(dataDir, "tls"), ready: make(chan struct{})}
	if tlsCert != "" {
		c, err := tls.LoadX509KeyPair(tlsCert, tlsKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		h.operator = true
		h.set(&c)
		return h, nil
	}
	if c, err := loadHTTPSCert(h.dir); err == nil {
		h.set(c)
	}
	return h, nil
}

// GetCertificate is tls.Config.GetCertificate: it refuses handshakes
// until the cluster has signed the node's certificate.
func (h *HTTPS) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
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

func (h *HTTPS) set(c *tls.Certificate) {
	h.mu.Lock()
	first := h.cert == nil
	h.cert = c
	h.mu.Unlock()
	if first {
		close(h.ready)
	}
}

func (h *HTTPS) current() *tls.Certificate {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cert
}

// FromCluster reports whether the certificate comes from the cluster's
// CA (not the operator), so that Loop must get and renew it.
func (h *HTTPS) FromCluster() bool { return !h.operator }

// Signer is what Loop needs of the agent to have its certificate signed.
type Signer struct {
	// ID, Name and Role are the node's; CertName is the name in its QUIC
	// certificate ("" in one from before names were bound), given to the
	// server that signs.
	ID, Name, Role, CertName string
	// AdvIP is the advertised IP the certificate must name ("" for none);
	// RPCAddr the node's QUIC address, given to the server that signs.
	AdvIP   string
	RPCAddr func() string
	// Sign asks a cluster server to sign the public key (PKIX DER):
	// coordinator.Client.HTTPSCert.
	Sign func(ctx context.Context, self coordinator.Peer, pub []byte) (*coordinator.HTTPSCertResponse, error)
}

// Loop gets the node's certificate from a server and renews it when it
// nears its expiry or no longer names the node's address, until done
// closes.
func (h *HTTPS) Loop(done <-chan struct{}, s Signer) {
	key, err := loadOrCreateHTTPSKey(h.dir)
	if err != nil {
		h.log.Error("HTTPS key: the API will refuse HTTPS connections", zap.Error(err))
		return
	}
	backoff := 200 * time.Millisecond
	var failing time.Time
	for {
		wait := time.Hour
		if c := h.current(); c == nil || s.renew(c.Leaf) {
			err := h.request(s, key)
			switch {
			case err == nil:
				backoff = 200 * time.Millisecond
				failing = time.Time{}
			case failing.IsZero() || time.Since(failing) > 30*time.Second:
				failing = time.Now()
				h.log.Info("no HTTPS certificate yet; retrying", zap.Error(err))
				fallthrough
			default:
				wait = backoff
				// Without a certificate the API refuses every client:
				// ask again soon; a renewal can wait longer.
				limit := 5 * time.Second
				if h.current() == nil {
					limit = time.Second
				}
				backoff = min(2*backoff, limit)
			}
		}
		select {
		case <-done:
			return
		case <-time.After(wait):
		}
	}
}

// renew reports whether leaf should be replaced: it expires within
// renewBefore, or it does not name the node's current name or address.
func (s Signer) renew(leaf *x509.Certificate) bool {
	if leaf == nil || time.Until(leaf.NotAfter) < renewBefore {
		return true
	}
	if s.AdvIP != "" && leaf.VerifyHostname(s.AdvIP) != nil {
		return true
	}
	names := map[string]bool{}
	for _, n := range leaf.DNSNames {
		names[n] = true
	}
	dns, _, _ := coordinator.HTTPSNames(s.ID, s.Name, "", nil)
	for _, n := range dns {
		if !names[n] {
			return true
		}
	}
	return false
}

// request asks the cluster to sign key and installs the answer.
func (h *HTTPS) request(s Signer, key *ecdsa.PrivateKey) error {
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := s.Sign(ctx, coordinator.Peer{ID: s.ID, Role: s.Role, Name: s.CertName, Addr: s.RPCAddr()}, pub)
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
	dir := h.dir
	if err := writeFileAtomic(filepath.Join(dir, httpsCAFile), pemCert(resp.CA), 0o644); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, httpsCertFile), pemCert(resp.Cert), 0o644); err != nil {
		return err
	}
	h.set(c)
	h.log.Info("HTTPS certificate issued by the cluster", zap.Strings("dns", c.Leaf.DNSNames),
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

// EnsureHTTPSCA creates the cluster's HTTPS CA on the first leader.
func EnsureHTTPSCA(srv *coordinator.Server, log *zap.Logger) {
	var have *coordinator.HTTPSCA
	srv.FSM().View(func(st *coordinator.State) { have = st.HTTPSCA })
	if have == nil {
		ca, err := coordinator.NewHTTPSCA()
		if err != nil {
			log.Error("creating the HTTPS CA", zap.Error(err))
			return
		}
		err = srv.Apply(coordinator.HTTPSCASetType|coordinator.IgnoreUnknownTypeFlag, coordinator.HTTPSCASetRequest{CA: *ca}, 5*time.Second)
		if err != nil && transport.StatusOf(err) != http.StatusConflict {
			log.Warn("storing the HTTPS CA", zap.Error(err))
			return
		}
		log.Info("created the cluster's HTTPS CA")
	}
}

// HTTPSCALoop, on servers, writes the HTTPS CA certificate to the data
// dir once the state has it, whether or not this agent serves HTTPS; it
// returns when it has, or when done closes.
func HTTPSCALoop(done <-chan struct{}, srv *coordinator.Server, dataDir string, log *zap.Logger) {
	for !writeHTTPSCA(srv, dataDir, log) {
		select {
		case <-done:
			return
		case <-srv.FSM().Changed():
		}
	}
}

// writeHTTPSCA writes the HTTPS CA certificate from this server's state
// to its data dir, so operators find it on every server (nodes serving
// HTTPS write it when their certificate arrives). It reports whether the
// file is there.
func writeHTTPSCA(srv *coordinator.Server, dataDir string, log *zap.Logger) bool {
	var pemCA string
	srv.FSM().View(func(st *coordinator.State) {
		if st.HTTPSCA != nil {
			pemCA = st.HTTPSCA.CertPEM
		}
	})
	if pemCA == "" {
		return false
	}
	path := HTTPSCAPath(dataDir)
	if b, err := os.ReadFile(path); err == nil && string(b) == pemCA {
		return true
	}
	if err := writeFileAtomic(path, []byte(pemCA), 0o644); err != nil {
		log.Warn("writing the HTTPS CA certificate", zap.Error(err))
		return false
	}
	return true
}

// Await waits up to d for the certificate.
func (h *HTTPS) Await(ctx context.Context, d time.Duration) {
	select {
	case <-h.ready:
	case <-ctx.Done():
	case <-time.After(d):
		h.log.Warn("no HTTPS certificate yet: the API refuses connections until a server signs one")
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
