package transport

import (
	"crypto"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"shoal/internal/version"
	"time"
)

// ServerName is the TLS name every node certificate carries. Peers are
// identified by the certificate's common name (the node ID) and
// organizational unit (the role), not by host names, which change.
const ServerName = "shoal.node"

// Roles carried in node certificates.
const (
	RoleServer = "server"
	RoleClient = "client"
)

// CA is the cluster certificate authority. Key is nil on nodes that only
// trust the CA (clients).
type CA struct {
	Cert *x509.Certificate
	DER  []byte
	Key  ed25519.PrivateKey
}

// DeriveCA derives a CA from a secret: the same secret gives the same key
// and certificate. Agents no longer make their cluster CA this way (a
// revoked bootstrap secret would still derive it); tests use it for a
// reproducible CA, and agents to recognise data dirs made that way.
func DeriveCA(secret string) (*CA, error) {
	if len(secret) < 16 {
		return nil, errors.New("bootstrap secret must be at least 16 characters")
	}
	seed, err := hkdf.Key(sha256.New, []byte(secret), []byte("shoal-ca-v1"), "cluster ca key", ed25519.SeedSize)
	if err != nil {
		return nil, err
	}
	return caFromKey(ed25519.NewKeyFromSeed(seed))
}

func caFromKey(key ed25519.PrivateKey) (*CA, error) {
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "shoal cluster CA", Organization: []string{"shoal"}},
		NotBefore:             time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC),
		NotAfter:              time.Date(2125, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	// Ed25519 signatures are deterministic, so the certificate is too.
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, DER: der, Key: key}, nil
}

// NewCA creates a cluster CA with a fresh random key: what a cluster
// trusts for its whole life, owed to no secret anyone types.
func NewCA() (*CA, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	return caFromKey(key)
}

// DeriveGossipKey derives the 32-byte memberlist key from the bootstrap
// secret. Joining nodes receive it from a server instead.
func DeriveGossipKey(secret string) []byte {
	k, err := hkdf.Key(sha256.New, []byte(secret), []byte("shoal-gossip-v1"), "gossip key", 32)
	if err != nil {
		panic(err) // only fails for absurd lengths
	}
	return k
}

// CAHash is the pin of a CA: sha256 over its SubjectPublicKeyInfo, as
// kubeadm's discovery-token-ca-cert-hash.
func CAHash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// oidPseudonym (X.520 pseudonym) carries the node's name in its
// certificate's subject.
var oidPseudonym = asn1.ObjectIdentifier{2, 5, 4, 65}

// Issue signs a node certificate for pub. The common name is the node ID,
// the organizational unit its role, and the pseudonym its name.
func (ca *CA) Issue(pub crypto.PublicKey, nodeID, name, role string) ([]byte, error) {
	if ca.Key == nil {
		return nil, errors.New("this node does not hold the CA key")
	}
	if role != RoleServer && role != RoleClient {
		return nil, fmt.Errorf("role %q: want server or client", role)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: nodeID, OrganizationalUnit: []string{role}, Organization: []string{"shoal"}, ExtraNames: names(name)},
		DNSNames:     []string{ServerName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
}

func names(name string) []pkix.AttributeTypeAndValue {
	if name == "" {
		return nil
	}
	return []pkix.AttributeTypeAndValue{{Type: oidPseudonym, Value: name}}
}

// certName is the node name a certificate binds ("" for certificates
// issued before names were).
func certName(c *x509.Certificate) string {
	for _, n := range c.Subject.Names {
		if n.Type.Equal(oidPseudonym) {
			if s, ok := n.Value.(string); ok {
				return s
			}
		}
	}
	return ""
}

// Identity is what a node presents and trusts on its endpoint.
type Identity struct {
	CA   *CA
	Cert tls.Certificate // leaf and CA chain
	ID   string
	Name string // the node name the certificate binds, if any
	Role string
}

// NewIdentity builds an identity from a CA, a signed leaf and its key.
func NewIdentity(ca *CA, leafDER []byte, key ed25519.PrivateKey) (*Identity, error) {
	leaf, err := x509.ParseCertificate(leafDER)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	if err := leaf.CheckSignatureFrom(ca.Cert); err != nil {
		return nil, fmt.Errorf("node certificate is not signed by the cluster CA: %w", err)
	}
	role := ""
	if len(leaf.Subject.OrganizationalUnit) > 0 {
		role = leaf.Subject.OrganizationalUnit[0]
	}
	return &Identity{
		CA:   ca,
		Cert: tls.Certificate{Certificate: [][]byte{leafDER, ca.DER}, PrivateKey: key, Leaf: leaf},
		ID:   leaf.Subject.CommonName,
		Name: certName(leaf),
		Role: role,
	}, nil
}

// SelfIssue creates a fresh key and a certificate signed by ca (which must
// hold its key).
func SelfIssue(ca *CA, nodeID, role string) (*Identity, error) {
	return SelfIssueNamed(ca, nodeID, "", role)
}

// SelfIssueNamed is SelfIssue for a certificate that binds the node name.
func SelfIssueNamed(ca *CA, nodeID, name, role string) (*Identity, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := ca.Issue(pub, nodeID, name, role)
	if err != nil {
		return nil, err
	}
	return NewIdentity(ca, der, key)
}

func (id *Identity) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(id.CA.Cert)
	return p
}

// ServerTLS accepts peers with a certificate of the cluster CA, and peers
// without one (who may only open join streams; the endpoint enforces it).
func (id *Identity) ServerTLS() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{id.Cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    id.pool(),
		MinVersion:   tls.VersionTLS13,
		NextProtos:   alpnFor(version.This),
	}
}

// ClientTLS presents the node certificate and trusts only the cluster CA.
func (id *Identity) ClientTLS() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{id.Cert},
		RootCAs:      id.pool(),
		ServerName:   ServerName,
		MinVersion:   tls.VersionTLS13,
		NextProtos:   alpnFor(version.This),
	}
}

// ErrCAMismatch is the error of a pinned dial to a server whose CA is not
// the one the join token names: retrying cannot help.
var ErrCAMismatch = errors.New("server's CA does not match the CA hash in the join token")

// PinnedTLS is the client configuration of a node that has no certificate
// yet: it trusts a server whose chain ends in a CA with the pinned hash and
// reports that CA through got.
func PinnedTLS(caHash string, got **x509.Certificate) *tls.Config {
	return &tls.Config{
		InsecureSkipVerify: true, // replaced by the pin check below
		MinVersion:         tls.VersionTLS13,
		NextProtos:         alpnFor(version.This),
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) < 2 {
				return errors.New("server sent no CA certificate")
			}
			leaf, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			for _, r := range raw[1:] {
				ca, err := x509.ParseCertificate(r)
				if err != nil {
					continue
				}
				if subtle.ConstantTimeCompare([]byte(CAHash(ca)), []byte(caHash)) != 1 {
					continue
				}
				pool := x509.NewCertPool()
				pool.AddCert(ca)
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: ServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
					return fmt.Errorf("server certificate: %w", err)
				}
				*got = ca
				return nil
			}
			return ErrCAMismatch
		},
	}
}

// Files under a node's data dir.
const (
	caFile    = "ca.pem"
	caKeyFile = "ca-key.pem"
	certFile  = "node.pem"
	keyFile   = "node-key.pem"
)

// Save writes the identity (and the CA key when held) to dir with 0600 files.
func (id *Identity) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(id.Cert.PrivateKey)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		caFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: id.CA.DER}),
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: id.Cert.Certificate[0]}),
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	if id.CA.Key != nil {
		caKey, err := x509.MarshalPKCS8PrivateKey(id.CA.Key)
		if err != nil {
			return err
		}
		files[caKeyFile] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: caKey})
	}
	for name, b := range files {
		if err := writeFileAtomic(filepath.Join(dir, name), b); err != nil {
			return err
		}
	}
	return nil
}

// LoadIdentity reads what Save wrote. It returns os.ErrNotExist (wrapped)
// when the node has never joined.
func LoadIdentity(dir string) (*Identity, error) {
	caDER, err := readPEM(filepath.Join(dir, caFile))
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", caFile, err)
	}
	ca := &CA{Cert: caCert, DER: caDER}
	if kb, err := readPEM(filepath.Join(dir, caKeyFile)); err == nil {
		k, err := x509.ParsePKCS8PrivateKey(kb)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", caKeyFile, err)
		}
		ca.Key, _ = k.(ed25519.PrivateKey)
	}
	leaf, err := readPEM(filepath.Join(dir, certFile))
	if err != nil {
		return nil, err
	}
	kb, err := readPEM(filepath.Join(dir, keyFile))
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kb)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s: not an ed25519 key", keyFile)
	}
	return NewIdentity(ca, leaf, key)
}

func readPEM(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: no PEM block", filepath.Base(path))
	}
	return blk.Bytes, nil
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// PeerIdentity extracts node ID and role from a verified peer chain.
func PeerIdentity(chain []*x509.Certificate) (id, role string) {
	if len(chain) == 0 {
		return "", ""
	}
	c := chain[0]
	if len(c.Subject.OrganizationalUnit) > 0 {
		role = c.Subject.OrganizationalUnit[0]
	}
	return c.Subject.CommonName, role
}
