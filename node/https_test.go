package node_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	oa "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"shoal/api"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// httpsServer starts one server that serves the tiny model and forces
// HTTPS on its loopback API; it returns the cluster and the pool holding
// the cluster's HTTPS CA.
func httpsServer(t *testing.T) (*tc.Cluster, *x509.CertPool) {
	t.Helper()
	model := writeModel(t)
	c := tc.NewWith(t, 1, func(i int, cfg *node.Config) {
		cfg.HTTPS = node.HTTPSOn
		cfg.Models = []node.ModelConfig{{Path: model, Ctx: 256}}
	})
	a := c.Members[0].Agent
	if !a.HTTPS() || !strings.HasPrefix(a.HTTPURL(), "https://") {
		t.Fatalf("agent forced to HTTPS serves %s", a.HTTPURL())
	}
	return c, caPool(t, c.Members[0].Cfg.DataDir)
}

func caPool(t *testing.T, dataDir string) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(node.HTTPSCAPath(dataDir))
	if err != nil {
		t.Fatalf("HTTPS CA certificate: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatal("the HTTPS CA file holds no certificate")
	}
	return pool
}

func httpsClient(pool *x509.CertPool) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// leafFor dials addr trusting pool and verifying the certificate for name;
// it returns the leaf the agent presented.
func leafFor(addr, name string, pool *x509.CertPool) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: name})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// TestHTTPSAgent: an agent forced to HTTPS serves the OpenAI endpoint and
// the cluster API over HTTPS with a certificate of the cluster's HTTPS CA
// for its name and 127.0.0.1; plain HTTP and clients without the CA are
// refused; a client node joined with a join token gets its own
// certificate, naming itself and not the server; a restart reuses the
// certificate.
func TestHTTPSAgent(t *testing.T) {
	c, pool := httpsServer(t)
	srv := c.Members[0].Agent
	addr := srv.HTTPAddr()

	for _, name := range []string{"127.0.0.1", "server-0", "localhost"} {
		if _, err := leafFor(addr, name, pool); err != nil {
			t.Errorf("certificate for %s: %v", name, err)
		}
	}
	leaf, err := leafFor(addr, "127.0.0.1", pool)
	if err != nil {
		t.Fatal(err)
	}
	if leaf.PublicKeyAlgorithm != x509.ECDSA || len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Errorf("certificate: key %v, usages %v; want ECDSA for server auth", leaf.PublicKeyAlgorithm, leaf.ExtKeyUsage)
	}

	hc := httpsClient(pool)
	get := func(cl *http.Client, url string) (int, string, error) {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+tc.Secret)
		resp, err := cl.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if code, body, err := get(hc, srv.HTTPURL()+"/v1/models"); err != nil || code != 200 || !strings.Contains(body, `"tiny"`) {
		t.Fatalf("GET /v1/models over HTTPS: %d %s %v", code, body, err)
	}
	if code, body, err := get(hc, srv.HTTPURL()+"/v1/cluster/models"); err != nil || code != 200 || !strings.Contains(body, `"tiny"`) {
		t.Fatalf("GET /v1/cluster/models over HTTPS: %d %s %v", code, body, err)
	}
	if code, _, err := get(http.DefaultClient, "http://"+addr+"/v1/models"); err == nil && code == 200 {
		t.Fatal("plain HTTP to the HTTPS port answered 200")
	}
	var unknown x509.UnknownAuthorityError
	if _, _, err := get(http.DefaultClient, srv.HTTPURL()+"/v1/models"); !errors.As(err, &unknown) {
		t.Fatalf("a client without the cluster's HTTPS CA: %v, want an unknown authority", err)
	}

	// A client node joined with a join token gets its own certificate.
	tok, err := c.Client(0, "").CreateToken(ctx(t), api.TokenRequest{Description: "https client"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.AddWith("client-1", false, tok.Secret, func(cfg *node.Config) { cfg.HTTPS = node.HTTPSOn })
	if err != nil {
		t.Fatal(err)
	}
	var cleaf *x509.Certificate
	tc.Eventually(t, 20*time.Second, "the client node's HTTPS certificate", func() bool {
		cleaf, err = leafFor(m.Agent.HTTPAddr(), "client-1", pool)
		return err == nil
	})
	if _, err := leafFor(m.Agent.HTTPAddr(), "127.0.0.1", pool); err != nil {
		t.Errorf("client node certificate for 127.0.0.1: %v", err)
	}
	if cleaf.VerifyHostname("server-0") == nil {
		t.Error("the client node's certificate names the server")
	}
	if leaf.VerifyHostname("client-1") == nil {
		t.Error("the server's certificate names the client node")
	}
	if !pool.Equal(caPool(t, m.Cfg.DataDir)) {
		t.Error("the client node wrote another HTTPS CA than the server's")
	}
	if b, err := os.ReadFile(node.HTTPSCAPath(m.Cfg.DataDir)); err != nil || strings.Contains(string(b), "PRIVATE KEY") {
		t.Errorf("client node's CA file: %v", err)
	}
	st, err := c.Client(1, "").Status(ctx(t))
	if err != nil || st.Leader == "" {
		t.Fatalf("status through the client node over HTTPS: %+v %v", st, err)
	}

	// A restart serves at once with the certificate it has.
	c.Stop(0, true)
	c.Restart(0)
	again, err := leafFor(c.Members[0].Agent.HTTPAddr(), "server-0", pool)
	if err != nil {
		t.Fatal(err)
	}
	if again.SerialNumber.Cmp(leaf.SerialNumber) != 0 {
		t.Error("the restarted agent got a new certificate instead of reusing its own")
	}
}

// TestHTTPSDefaults: without a mode the API is plain HTTP on loopback and
// HTTPS on any other bind address; --insecure-http turns HTTPS off.
func TestHTTPSDefaults(t *testing.T) {
	c := tc.New(t, 1)
	if a := c.Members[0].Agent; a.HTTPS() || !strings.HasPrefix(a.HTTPURL(), "http://") {
		t.Fatalf("loopback agent serves %s, want plain HTTP", a.HTTPURL())
	}
	for _, x := range []struct {
		cfg  node.Config
		want bool
	}{
		{node.Config{Bind: "127.0.0.1"}, false},
		{node.Config{Bind: "::1"}, false},
		{node.Config{}, true},
		{node.Config{Bind: "0.0.0.0"}, true},
		{node.Config{Bind: "192.0.2.1"}, true},
		{node.Config{Bind: "0.0.0.0", HTTPS: node.HTTPSOff}, false},
		{node.Config{Bind: "127.0.0.1", HTTPS: node.HTTPSOn}, true},
		{node.Config{Bind: "127.0.0.1", TLSCert: "c.pem", TLSKey: "k.pem"}, true},
	} {
		if got := x.cfg.HTTPSEnabled(); got != x.want {
			t.Errorf("bind %q https %q cert %q: HTTPS %v, want %v", x.cfg.Bind, x.cfg.HTTPS, x.cfg.TLSCert, got, x.want)
		}
	}
}

// TestHTTPSClients: curl with --cacert, and the official openai-go client
// with the cluster's HTTPS CA as its only root, talk to an agent over
// HTTPS.
func TestHTTPSClients(t *testing.T) {
	c, pool := httpsServer(t)
	a := c.Members[0].Agent
	t.Run("curl", func(t *testing.T) {
		curl, err := exec.LookPath("curl")
		if err != nil {
			t.Skip("curl is not installed")
		}
		out, err := exec.Command(curl, "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}",
			"--cacert", node.HTTPSCAPath(c.Members[0].Cfg.DataDir),
			"-H", "Authorization: Bearer "+tc.Secret, a.HTTPURL()+"/v1/models").CombinedOutput()
		if err != nil || string(out) != "200" {
			t.Fatalf("curl --cacert: %s %v", out, err)
		}
		// Without the CA curl refuses the certificate.
		out, err = exec.Command(curl, "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}",
			"-H", "Authorization: Bearer "+tc.Secret, a.HTTPURL()+"/v1/models").CombinedOutput()
		if err == nil {
			t.Fatalf("curl without the CA: %s", out)
		}
	})
	t.Run("openai-go", func(t *testing.T) {
		cl := oa.NewClient(option.WithBaseURL(a.HTTPURL()+"/v1/"), option.WithAPIKey(tc.Secret),
			option.WithMaxRetries(0), option.WithHTTPClient(httpsClient(pool)))
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := cl.Chat.Completions.New(cctx, oa.ChatCompletionNewParams{Model: "tiny", MaxTokens: oa.Int(6),
			Messages: []oa.ChatCompletionMessageParamUnion{oa.UserMessage("Hello")}})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Choices) != 1 || res.Usage.CompletionTokens == 0 {
			t.Fatalf("chat completion over HTTPS: %+v", res)
		}
		t.Logf("chat completion over HTTPS: %q (%d tokens)", res.Choices[0].Message.Content, res.Usage.CompletionTokens)
	})
}

// TestHTTPSOperatorCertificate: with --tls-cert/--tls-key the API serves
// the operator's certificate (any key type; here Ed25519), even on
// loopback, and no certificate of the cluster's CA.
func TestHTTPSOperatorCertificate(t *testing.T) {
	dir := t.TempDir()
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(42), Subject: pkix.Name{CommonName: "operator"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalPKCS8PrivateKey(key)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	_ = os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	_ = os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600)

	c := tc.NewWith(t, 1, func(i int, cfg *node.Config) { cfg.TLSCert, cfg.TLSKey = certFile, keyFile })
	a := c.Members[0].Agent
	if !strings.HasPrefix(a.HTTPURL(), "https://") {
		t.Fatalf("agent with --tls-cert serves %s", a.HTTPURL())
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	leaf, err := leafFor(a.HTTPAddr(), "127.0.0.1", pool)
	if err != nil {
		t.Fatal(err)
	}
	if leaf.SerialNumber.Int64() != 42 {
		t.Fatalf("served certificate %v, want the operator's", leaf.Subject)
	}
	code, _, err := func() (int, string, error) {
		req, _ := http.NewRequest("GET", a.HTTPURL()+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+tc.Secret)
		resp, err := httpsClient(pool).Do(req)
		if err != nil {
			return 0, "", err
		}
		resp.Body.Close()
		return resp.StatusCode, "", nil
	}()
	if err != nil || code != 200 {
		t.Fatalf("GET /v1/models with the operator's certificate: %d %v", code, err)
	}
}
