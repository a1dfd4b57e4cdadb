package identity

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"shoal/internal/version"
	"time"

	"go.uber.org/zap"

	"shoal/transport"
)

// Identity and secure join: a node's ID, its certificate (signed
// with the cluster CA agreed at bootstrap, or issued by the leader for a
// join token), and the join stream servers answer.

// LoadNodeID reads the node's ID from the data dir's node-id file, or
// makes a random one and writes it there.
func LoadNodeID(dir string) (string, error) {
	path := filepath.Join(dir, "node-id")
	if b, err := os.ReadFile(path); err == nil {
		id := string(b)
		if len(id) != 36 {
			return "", fmt.Errorf("%s is corrupt: want a 36-character node ID", path)
		}
		return id, nil
	}
	id, err := newNodeID()
	if err != nil {
		return "", err
	}
	return id, saveNodeID(dir, id)
}

func saveNodeID(dir, id string) error {
	if err := os.WriteFile(filepath.Join(dir, "node-id"), []byte(id), 0o600); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	return nil
}

// newNodeID is a random UUID-shaped ID.
func newNodeID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32], nil
}

// Config is what setting up the node's identity needs of the agent.
type Config struct {
	DataDir string
	ID      string // the node's ID (LoadNodeID)
	Name    string // --name
	Role    string // coordinator.RoleServer or RoleClient
	// Server and BootstrapExpect are --server and --bootstrap-expect.
	Server          bool
	BootstrapExpect int
	Token           string   // --token: the bootstrap secret or a join token
	Join            []string // the --join addresses, host:port
	// Bind and QUICPort are where a server bootstrapping with others
	// answers their polls.
	Bind        string
	QUICPort    int
	JoinTimeout time.Duration // how long joining or bootstrapping retries (5 minutes if 0)
	Log         *zap.Logger
	// Protocols and Build are the node's protocol window and version
	// (zero: this build's); tests join as another build.
	Protocols version.Window
	Build     string
}

func (c *Config) joinTimeout() time.Duration {
	if c.JoinTimeout > 0 {
		return c.JoinTimeout
	}
	return 5 * time.Minute
}

// Node is a node's identity in the cluster.
type Node struct {
	ID   string              // the node's ID: the cluster names a node that joins with a token
	Cert *transport.Identity // its certificate, the cluster CA's (with the CA key on servers)
	// GossipKey encrypts gossip; BootstrapSecret is the servers' shared
	// secret when --token was one ("" otherwise).
	GossipKey       []byte
	BootstrapSecret string
	Seeds           []string // gossip addresses the join answer named
}

// joiner sets up the identity: the agent's fields it had, now its own.
type joiner struct {
	cfg             Config
	id, role        string
	log             *zap.Logger
	ident           *transport.Identity
	gossipKey       []byte
	bootstrapSecret string
	seeds           []string
}

// Setup loads the node's certificate and gossip key from the data dir's
// tls/ folder, or creates them: from the bootstrap secret (servers agree
// on a CA) or by joining with a token; it saves what it made there.
func Setup(ctx context.Context, cfg Config) (*Node, error) {
	a := &joiner{cfg: cfg, id: cfg.ID, role: cfg.Role, log: cfg.Log}
	if err := a.setupIdentity(ctx); err != nil {
		return nil, err
	}
	return &Node{ID: a.id, Cert: a.ident, GossipKey: a.gossipKey, BootstrapSecret: a.bootstrapSecret, Seeds: a.seeds}, nil
}

func (a *joiner) setupIdentity(ctx context.Context) error {
	tlsDir := filepath.Join(a.cfg.DataDir, "tls")
	token := a.cfg.Token
	if token != "" && !IsJoinToken(token) {
		a.bootstrapSecret = token
	}
	ident, err := transport.LoadIdentity(tlsDir)
	if err == nil {
		if ident.ID != a.id {
			return fmt.Errorf("certificate in %s belongs to node %s, not %s", tlsDir, ident.ID, a.id)
		}
		if a.bootstrapSecret != "" {
			if err := checkBootstrapSecret(tlsDir, a.bootstrapSecret, ident.CA); err != nil {
				return err
			}
		}
		if ident.Role != a.role {
			return fmt.Errorf("this data dir holds a %s; start with the same role (or a fresh --data-dir)", ident.Role)
		}
		if ident.Name != "" && ident.Name != a.cfg.Name {
			return fmt.Errorf("this data dir's certificate names the node %q: start it with --name %s (or a fresh --data-dir and a new join token)", ident.Name, ident.Name)
		}
		a.ident = ident
		a.gossipKey, err = os.ReadFile(filepath.Join(tlsDir, "gossip.key"))
		if err != nil {
			return fmt.Errorf("gossip key: %w", err)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("identity in %s: %w", tlsDir, err)
	}
	// An API key taken for a secret would derive a CA of its own, and the
	// node would retry forever against servers that never trust it.
	if id, _, _, ok := ParseToken(a.bootstrapSecret); ok {
		return fmt.Errorf("--token %s.… has the form of an API key (ID.secret), not of a join token (ID.secret.CA-hash) "+
			"or a bootstrap secret: a new node joins with a token from 'shoal token create'", id)
	}
	switch {
	case token == "" && a.cfg.Server && a.cfg.BootstrapExpect == 1:
		a.bootstrapSecret = RandomString(32)
		p := filepath.Join(a.cfg.DataDir, "bootstrap-token")
		if err := os.WriteFile(p, []byte(a.bootstrapSecret+"\n"), 0o600); err != nil {
			return err
		}
		a.log.Warn("created a cluster secret; it is also the admin API key until you create one", zap.String("file", p))
		fallthrough
	case a.bootstrapSecret != "":
		if err := a.bootstrapIdentity(ctx); err != nil {
			return err
		}
		if err := os.MkdirAll(tlsDir, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tlsDir, bootstrapSumFile), []byte(bootstrapSecretSum(a.bootstrapSecret)+"\n"), 0o600); err != nil {
			return err
		}
	case token != "":
		if err := a.joinWithToken(ctx, token); err != nil {
			return err
		}
	default:
		return fmt.Errorf("no cluster identity in %s: give --token (the servers' shared secret, or a join token from 'shoal token create')", a.cfg.DataDir)
	}
	if err := a.ident.Save(tlsDir); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(tlsDir, "gossip.key"), a.gossipKey, 0o600)
}

// joinRequest is what a node without a certificate sends on a join stream.
type joinRequest struct {
	Token     string `json:"token"`
	NodeID    string `json:"node_id"`
	Name      string `json:"name"`
	Role      string `json:"role"`
	PublicKey []byte `json:"public_key"`
	// Bootstrap is a sealed bootstrapPoll (no token then).
	Bootstrap []byte `json:"bootstrap,omitempty"`
	// Version and Protocol are the joining build's (absent from builds
	// before protocol 2): the server logs them.
	Version  string `json:"version,omitempty"`
	Protocol int    `json:"protocol,omitempty"`
}

type joinResponse struct {
	NodeID    string   `json:"node_id,omitempty"` // the ID the cluster gives the node
	Err       string   `json:"err,omitempty"`
	Code      int      `json:"code,omitempty"`
	CACert    []byte   `json:"ca_cert,omitempty"`
	CAKey     []byte   `json:"ca_key,omitempty"` // servers only
	Cert      []byte   `json:"cert,omitempty"`
	GossipKey []byte   `json:"gossip_key,omitempty"`
	Seeds     []string `json:"seeds,omitempty"`
	Bootstrap []byte   `json:"bootstrap,omitempty"` // a sealed bootstrapAnswer
}

const maxJoinFrame = 64 << 10

func (a *joiner) joinWithToken(ctx context.Context, token string) error {
	_, _, caHash, _ := ParseToken(token)
	if len(a.cfg.Join) == 0 {
		return errors.New("a join token needs --join with the address of a server")
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	w, build := a.cfg.Protocols.Or(), version.BuildOr(a.cfg.Build)
	req, _ := json.Marshal(joinRequest{Token: token, NodeID: a.id, Name: a.cfg.Name, Role: a.role, PublicKey: pub, Version: build, Protocol: w.Max})
	deadline := time.Now().Add(a.cfg.joinTimeout())
	var last error
	for backoff := 200 * time.Millisecond; time.Now().Before(deadline); {
		mismatched := 0
		for _, addr := range a.cfg.Join {
			resp, err := joinOnce(ctx, addr, caHash, req, w, build)
			if errors.Is(err, transport.ErrCAMismatch) {
				return fmt.Errorf("%w: that server belongs to another cluster, or the token is not this cluster's (make one there with 'shoal token create')", err)
			}
			if transport.IsVersionMismatch(err) {
				// Another server may be of a release this one works with
				// (the cluster is being upgraded); when none is, retrying
				// cannot help.
				mismatched++
				last = err
				continue
			}
			if err != nil {
				last = err
				continue
			}
			if resp.Err != "" {
				last = fmt.Errorf("join refused by %s: %s", addr, resp.Err)
				if resp.Code == http.StatusForbidden || resp.Code == http.StatusBadRequest || resp.Code == http.StatusConflict {
					return last
				}
				continue
			}
			return a.acceptJoin(resp, caHash, key)
		}
		if mismatched == len(a.cfg.Join) {
			return fmt.Errorf("could not join: %w", last)
		}
		a.log.Info("join failed; retrying", zap.Error(last))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		if backoff < 2*time.Second {
			backoff *= 2
		}
	}
	return fmt.Errorf("could not join: %v", last)
}

func joinOnce(ctx context.Context, addr, caHash string, req []byte, w version.Window, build string) (*joinResponse, error) {
	st, done, err := transport.DialPinnedAs(ctx, addr, caHash, transport.KindJoin, 3*time.Second, w, build)
	if err != nil {
		return nil, err
	}
	defer done()
	return exchangeJoin(st, "join", addr, req, 10*time.Second)
}

// exchangeJoin sends req on a join stream and reads the answer; what
// names the exchange in errors.
func exchangeJoin(st *transport.Stream, what, addr string, req []byte, timeout time.Duration) (*joinResponse, error) {
	_ = st.SetDeadline(time.Now().Add(timeout))
	if err := transport.WriteFrame(st, req); err != nil {
		return nil, err
	}
	_ = st.CloseWrite()
	b, err := transport.ReadFrame(st, maxJoinFrame)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, addr, err)
	}
	var resp joinResponse
	if err := json.Unmarshal(b, &resp); err != nil {
		return nil, fmt.Errorf("%s %s: malformed answer", what, addr)
	}
	return &resp, nil
}

func (a *joiner) acceptJoin(resp *joinResponse, caHash string, key ed25519.PrivateKey) error {
	caCert, err := parseCert(resp.CACert)
	if err != nil {
		return fmt.Errorf("join: CA certificate: %w", err)
	}
	if transport.CAHash(caCert) != caHash {
		return errors.New("join: the server sent a CA that does not match the token's CA hash")
	}
	ca := &transport.CA{Cert: caCert, DER: resp.CACert}
	if len(resp.CAKey) > 0 {
		k, err := parsePKCS8(resp.CAKey)
		if err != nil {
			return fmt.Errorf("join: CA key: %w", err)
		}
		ca.Key = k
	}
	a.ident, err = transport.NewIdentity(ca, resp.Cert, key)
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	if a.ident.ID != resp.NodeID || resp.NodeID == "" {
		return fmt.Errorf("join: the certificate is for node %q, the answer names %q", a.ident.ID, resp.NodeID)
	}
	if a.ident.ID != a.id { // the cluster names the node
		if err := saveNodeID(a.cfg.DataDir, a.ident.ID); err != nil {
			return err
		}
		a.id = a.ident.ID
	}
	if len(resp.GossipKey) != 32 {
		return errors.New("join: the server sent no gossip key")
	}
	a.gossipKey = resp.GossipKey
	a.seeds = resp.Seeds
	a.log.Info("joined the cluster with a token; certificate issued")
	return nil
}
