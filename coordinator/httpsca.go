package coordinator

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"time"
)

// HTTPSCA is the certificate authority of the agents' HTTPS API. It is
// separate from the node CA because that one is Ed25519, which browsers
// refuse in TLS certificate chains; this one is ECDSA P-256. The leader
// creates it once (HTTPSCASetType); every server holds it in the state and
// signs the certificates nodes ask for (MethodHTTPSCert). KeyPEM is empty
// in the copy a client node reads.
type HTTPSCA struct {
	CertPEM string `json:"cert_pem"`
	KeyPEM  string `json:"key_pem,omitempty"`
}

// HTTPSCASetRequest stores the cluster's HTTPS CA; the first one wins.
type HTTPSCASetRequest struct {
	CA HTTPSCA `json:"ca"`
}

// HTTPSCertRequest is what a node sends to get its HTTPS certificate: only
// the public key (PKIX DER) of a key it keeps. The names and addresses the
// certificate carries are the server's to decide.
type HTTPSCertRequest struct {
	PublicKey []byte `json:"public_key"`
}

// HTTPSCertResponse is the signed leaf and the CA certificate, both DER.
type HTTPSCertResponse struct {
	Cert []byte `json:"cert"`
	CA   []byte `json:"ca"`
}

// Validity of the HTTPS CA and of the leaves it signs.
const (
	httpsCAValidity   = 20 * 365 * 24 * time.Hour
	HTTPSCertValidity = 365 * 24 * time.Hour
)

// NewHTTPSCA makes a random ECDSA P-256 CA.
func NewHTTPSCA() (*HTTPSCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "shoal cluster HTTPS CA", Organization: []string{"shoal"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(httpsCAValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &HTTPSCA{
		CertPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		KeyPEM:  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})),
	}, nil
}

func randSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// Cert parses the CA certificate.
func (ca *HTTPSCA) Cert() (*x509.Certificate, []byte, error) {
	b, _ := pem.Decode([]byte(ca.CertPEM))
	if b == nil {
		return nil, nil, errors.New("HTTPS CA: no certificate")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	return c, b.Bytes, err
}

// Issue signs a server certificate for pub naming dnsNames and ips, valid
// for HTTPSCertValidity.
func (ca *HTTPSCA) Issue(pub crypto.PublicKey, dnsNames []string, ips []net.IP) ([]byte, error) {
	cert, _, err := ca.Cert()
	if err != nil {
		return nil, err
	}
	kb, _ := pem.Decode([]byte(ca.KeyPEM))
	if kb == nil {
		return nil, errors.New("this node does not hold the HTTPS CA key")
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("HTTPS CA key: %w", err)
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("HTTPS CA key cannot sign")
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	cn := "shoal agent"
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"shoal"}},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(HTTPSCertValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return x509.CreateCertificate(rand.Reader, tmpl, cert, pub, key)
}

// HTTPSNames are the names and addresses an HTTPS certificate for node id
// carries: the name its node certificate binds (certName; the state's
// name for certificates issued before names were), when it is a valid
// host name, the IPs the cluster reaches it at (its certified addresses
// in the state, and remote, the address of the connection it asked on),
// and loopback. They come from the node's certificate and what the
// cluster verified, never from the node's request or from gossip, so no
// node gets a certificate for another's name or address. ok is false
// when nothing names the node.
func HTTPSNames(id, certName, remote string, st *State) (dns []string, ips []net.IP, ok bool) {
	seenName := map[string]bool{}
	seenIP := map[string]bool{}
	addName := func(n string) {
		if n != "" && !seenName[n] && validHostName(n) {
			seenName[n] = true
			dns = append(dns, n)
		}
	}
	addIP := func(hostport string) {
		h, _, err := net.SplitHostPort(hostport)
		if err != nil {
			h = hostport
		}
		ip := net.ParseIP(h)
		if ip == nil || ip.IsUnspecified() || seenIP[ip.String()] {
			return
		}
		seenIP[ip.String()] = true
		ips = append(ips, ip)
	}
	var n *Node
	if st != nil {
		n = st.Nodes[id]
	}
	switch {
	case certName != "":
		addName(certName)
	case n != nil:
		addName(n.Name)
	default:
		return nil, nil, false
	}
	if n != nil {
		addIP(n.Addr)
		addIP(n.RPCAddr)
	}
	if remote != "" {
		addIP(remote)
	}
	addName("localhost")
	addIP("127.0.0.1")
	addIP("::1")
	return dns, ips, true
}

// validHostName reports whether s can be a DNS name in a certificate:
// labels of letters, digits and hyphens.
func validHostName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	label := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		case c == '-':
			if label == 0 {
				return false
			}
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
	}
	return label > 0 && s[len(s)-1] != '-'
}

// HTTPSCert gets the HTTPS certificate of the node self for the public
// key pub: a server signs it from its own state, a client agent asks a
// server.
func (c *Client) HTTPSCert(ctx context.Context, self Peer, pub []byte) (*HTTPSCertResponse, error) {
	req := HTTPSCertRequest{PublicKey: pub}
	if c.srv != nil {
		return c.issueHTTPS(self, req)
	}
	addr, err := c.ServerAddr()
	if err != nil {
		return nil, err
	}
	var resp HTTPSCertResponse
	if err := c.call.Call(ctx, addr, MethodHTTPSCert, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// issueHTTPS signs the HTTPS certificate of the node peer (as its node
// certificate names it) from this server's copy of the state.
func (c *Client) issueHTTPS(peer Peer, req HTTPSCertRequest) (*HTTPSCertResponse, error) {
	pub, err := x509.ParsePKIXPublicKey(req.PublicKey)
	if err != nil {
		return nil, &Error{Code: http.StatusBadRequest, Msg: "HTTPS certificate request: malformed public key"}
	}
	if k, ok := pub.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		return nil, &Error{Code: http.StatusBadRequest, Msg: "HTTPS certificate request: want an ECDSA P-256 public key"}
	}
	var ca *HTTPSCA
	var dns []string
	var ips []net.IP
	var known bool
	c.srv.FSM().View(func(st *State) {
		if st.HTTPSCA != nil {
			v := *st.HTTPSCA
			ca = &v
		}
		dns, ips, known = HTTPSNames(peer.ID, peer.Name, peer.Addr, st)
	})
	if ca == nil || ca.KeyPEM == "" {
		return nil, &Error{Code: http.StatusServiceUnavailable, Msg: "the cluster has no HTTPS CA yet"}
	}
	if peer.ID == "" || !known {
		return nil, &Error{Code: http.StatusServiceUnavailable, Msg: fmt.Sprintf("node %s is not known to this server yet", peer.ID)}
	}
	der, err := ca.Issue(pub, dns, ips)
	if err != nil {
		return nil, err
	}
	_, caDER, err := ca.Cert()
	if err != nil {
		return nil, err
	}
	return &HTTPSCertResponse{Cert: der, CA: caDER}, nil
}

func decodeHTTPSCertRequest(body json.RawMessage) (HTTPSCertRequest, error) {
	var req HTTPSCertRequest
	if err := json.Unmarshal(body, &req); err != nil || len(req.PublicKey) == 0 {
		return req, &Error{Code: http.StatusBadRequest, Msg: "malformed HTTPS certificate request"}
	}
	return req, nil
}
