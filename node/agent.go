package node

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"shoal/api/openai"
	"shoal/coordinator"
	"shoal/internal/zapio"
	"shoal/parallel"
	"shoal/shard"
	"shoal/transport"
)

// Agent is one running `shoal agent`.
type Agent struct {
	cfg  Config
	id   string
	role string
	log  *zap.Logger

	ident           *transport.Identity
	gossipKey       []byte
	bootstrapSecret string
	caps            coordinator.Capabilities

	ep     *transport.Endpoint
	rpc    *transport.RPCServer
	gossip *gossip
	ml     *memberlist.Memberlist
	srv    *coordinator.Server
	http   *http.Server
	httpLn net.Listener
	advIP  string
	seeds  []string

	files   *fileRegistry // model files this node has and serves to peers
	layouts signedLayouts
	shards  *shard.Manager // the shards the plans give this node

	mb  *transport.Mailbox   // the endpoint's activation mailbox
	par *parallel.Reconciler // members and drivers of the plans this node is in

	models   *openai.StaticBackend // models this agent serves (the OpenAI endpoint's backend)
	pub      *publisher            // puts the models this node drives into models
	registry *prometheus.Registry
	observer openai.Observer

	stopOnce sync.Once
	done     chan struct{}
	bg       sync.WaitGroup
}

// Start brings the agent up: identity (joining with the token when the data
// dir has none), QUIC endpoint, gossip, Raft (servers) and the admin API.
// Joining gossip continues in the background.
func Start(ctx context.Context, cfg Config) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	a := &Agent{cfg: cfg, role: coordinator.RoleClient, done: make(chan struct{})}
	if cfg.Server {
		a.role = coordinator.RoleServer
	}
	var err error
	if a.id, err = loadNodeID(cfg.DataDir); err != nil {
		return nil, err
	}
	a.log = zap.L().Named("agent").With(zap.String("node", cfg.Name))
	if err := a.setupIdentity(ctx); err != nil {
		return nil, err
	}
	a.caps = ProbeCapabilities(cfg.DataDir, cfg.Version, cfg.Tuning.ProbeDuration.or(300*time.Millisecond))
	if l := cfg.MemoryLimit; l > 0 {
		// Advertise no more than the operator allows models to use.
		a.caps.MemTotal, a.caps.MemFree = min(a.caps.MemTotal, l), min(a.caps.MemFree, l)
	}
	a.files = openFileRegistry(cfg.DataDir, a.log)
	local, err := a.localRequests()
	if err != nil {
		return nil, err
	}
	if err := a.start(); err != nil {
		a.close(false)
		return nil, err
	}
	a.log.Info("agent started", zap.String("id", a.id), zap.String("role", a.role),
		zap.String("quic", a.RPCAddr()), zap.String("gossip", a.GossipAddr()), zap.String("http", a.HTTPAddr()))
	a.bg.Add(4)
	go a.registerLocal(local)
	go a.joinLoop()
	go a.servingLoop()
	go a.linkLoop()
	if cfg.BootstrapExpect == 1 {
		a.awaitLocal(ctx, 30*time.Second)
	}
	return a, nil
}

func loadNodeID(dir string) (string, error) {
	path := filepath.Join(dir, "node-id")
	if b, err := os.ReadFile(path); err == nil {
		id := string(b)
		if len(id) != 36 {
			return "", fmt.Errorf("%s is corrupt: want a 36-character node ID", path)
		}
		return id, nil
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	h := hex.EncodeToString(b[:])
	id := h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
	if err := os.WriteFile(path, []byte(id), 0o600); err != nil {
		return "", fmt.Errorf("data dir: %w", err)
	}
	return id, nil
}

// setupIdentity loads the node's certificate, or creates it: from the
// bootstrap secret (servers derive the CA) or by joining with a token.
func (a *Agent) setupIdentity(ctx context.Context) error {
	tlsDir := filepath.Join(a.cfg.DataDir, "tls")
	token := a.cfg.Token
	if token != "" && !isJoinToken(token) {
		a.bootstrapSecret = token
	}
	ident, err := transport.LoadIdentity(tlsDir)
	if err == nil {
		if ident.ID != a.id {
			return fmt.Errorf("certificate in %s belongs to node %s, not %s", tlsDir, ident.ID, a.id)
		}
		if a.bootstrapSecret != "" {
			ca, err := transport.DeriveCA(a.bootstrapSecret)
			if err != nil {
				return err
			}
			if transport.CAHash(ca.Cert) != transport.CAHash(ident.CA.Cert) {
				return errors.New("--token does not match the cluster this data dir belongs to")
			}
		}
		if ident.Role != a.role {
			return fmt.Errorf("this data dir holds a %s; start with the same role (or a fresh --data-dir)", ident.Role)
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
	switch {
	case token == "" && a.cfg.Server && a.cfg.BootstrapExpect == 1:
		a.bootstrapSecret = randomString(32)
		p := filepath.Join(a.cfg.DataDir, "bootstrap-token")
		if err := os.WriteFile(p, []byte(a.bootstrapSecret+"\n"), 0o600); err != nil {
			return err
		}
		a.log.Warn("created a cluster secret; it is also the admin API key until you create one", zap.String("file", p))
		fallthrough
	case a.bootstrapSecret != "":
		ca, err := transport.DeriveCA(a.bootstrapSecret)
		if err != nil {
			return err
		}
		if a.ident, err = transport.SelfIssue(ca, a.id, a.role); err != nil {
			return err
		}
		if a.role != coordinator.RoleServer {
			a.ident.CA = &transport.CA{Cert: ca.Cert, DER: ca.DER}
		}
		a.gossipKey = transport.DeriveGossipKey(a.bootstrapSecret)
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

func (a *Agent) start() error {
	var err error
	a.ep, err = transport.Listen(transport.Config{
		Bind:     net.JoinHostPort(orDefault(a.cfg.Bind, "0.0.0.0"), strconv.Itoa(a.cfg.QUICPort)),
		Identity: a.ident,
	})
	if err != nil {
		return err
	}
	// The RPC methods and the join handler read gossip and Raft state, so
	// they are registered below, once both exist; a peer calling earlier
	// gets "unknown method" and retries.
	a.rpc = transport.NewRPCServer(a.ep, transport.KindRPC, rpcTimeout)
	a.mb = transport.NewMailbox(a.ep, transport.MailboxOptions{})

	// The HTTP listener comes first so its port can ride in gossip meta.
	a.httpLn, err = net.Listen("tcp", net.JoinHostPort(orDefault(a.cfg.Bind, "0.0.0.0"), strconv.Itoa(a.cfg.HTTPPort)))
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	m := meta{
		Name: a.cfg.Name, Role: a.role, Version: a.cfg.Version,
		QUIC: a.ep.Addr().Port, HTTP: a.httpLn.Addr().(*net.TCPAddr).Port, Expect: a.cfg.BootstrapExpect,
		Mem: a.caps.MemTotal, Free: a.caps.MemFree, Cores: a.caps.Cores, GFLOPS: a.caps.GFLOPS, GBps: a.caps.MemGBps, Accel: a.caps.Accel,
	}
	mb, err := m.encode()
	if err != nil {
		return err
	}
	a.gossip = newGossip(mb)
	mc := memberlist.DefaultLANConfig()
	mc.Name = a.id
	mc.BindAddr = orDefault(a.cfg.Bind, "0.0.0.0")
	mc.BindPort = a.cfg.GossipPort
	mc.AdvertisePort = a.cfg.GossipPort
	mc.AdvertiseAddr = a.cfg.Advertise
	mc.SecretKey = a.gossipKey
	mc.Delegate = a.gossip
	mc.Events = a.gossip
	mc.Logger = zapio.StdLogger(zap.L().Named("gossip"))
	if p := a.cfg.Tuning.GossipProbe.or(0); p > 0 {
		mc.ProbeInterval = p
		mc.ProbeTimeout = p / 2
		mc.GossipInterval = p / 4
		mc.SuspicionMult = 2
		mc.TCPTimeout = 4 * p
	}
	a.ml, err = memberlist.Create(mc)
	if err != nil {
		return fmt.Errorf("gossip: %w", err)
	}
	a.gossip.ml = a.ml
	a.advIP = a.ml.LocalNode().Addr.String()

	if a.cfg.Server {
		adv := &net.UDPAddr{IP: net.ParseIP(a.advIP), Port: a.ep.Addr().Port}
		rt := a.cfg.Tuning.RaftTimeout.or(500 * time.Millisecond)
		a.srv, err = coordinator.NewServer(coordinator.Config{
			NodeID: a.id, DataDir: a.cfg.DataDir, Layer: transport.NewRaftLayer(a.ep, adv), Members: a.gossip,
			Bootstrap:           a.cfg.BootstrapExpect,
			PeerHasState:        a.peerHasState,
			OnLeader:            a.onLeader,
			HeartbeatTimeout:    rt,
			ElectionTimeout:     rt,
			LeaderLeaseTimeout:  rt / 2,
			ReconcileInterval:   a.cfg.Tuning.ReconcileInterval.or(2 * time.Second),
			DeadServerGrace:     a.cfg.Tuning.DeadServerGrace.or(30 * time.Second),
			ServerStabilization: a.cfg.Tuning.ServerStabilization.or(2 * time.Second),
		})
		if err != nil {
			return err
		}
	}
	a.registerRPC()
	a.registerModelRPC()
	a.ep.Handle(transport.KindJoin, a.serveJoin)
	transport.ServeWeights(a.ep, a.files, transport.WeightsOptions{})
	transport.ServeProbe(a.ep, 0)
	a.models = openai.NewStaticBackend()
	a.startServing()
	if err := a.setupMetrics(); err != nil {
		return err
	}
	a.http = &http.Server{Handler: a.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = a.http.Serve(a.httpLn) }()
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ID of the node.
func (a *Agent) ID() string { return a.id }

// Name of the node.
func (a *Agent) Name() string { return a.cfg.Name }

// Server is the coordinator (nil on clients).
func (a *Agent) Server() *coordinator.Server { return a.srv }

// HTTPAddr is where the admin API listens (loopback if bound to any).
func (a *Agent) HTTPAddr() string { return a.localAddr(a.httpLn.Addr().(*net.TCPAddr).Port) }

// RPCAddr is the advertised QUIC address.
func (a *Agent) RPCAddr() string { return net.JoinHostPort(a.advIP, strconv.Itoa(a.ep.Addr().Port)) }

// GossipAddr is the advertised gossip address.
func (a *Agent) GossipAddr() string {
	n := a.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

func (a *Agent) localAddr(port int) string {
	host := a.cfg.Bind
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// Done is closed when the agent has stopped (e.g. after `shoal node rm`).
func (a *Agent) Done() <-chan struct{} { return a.done }

// Shutdown stops the agent. graceful hands off leadership and announces
// the leave to gossip; otherwise the node looks failed to its peers.
func (a *Agent) Shutdown(graceful bool) error {
	a.close(graceful)
	return nil
}

func (a *Agent) close(graceful bool) {
	a.stopOnce.Do(func() {
		close(a.done)
		if graceful && a.srv != nil {
			a.srv.Leave()
		}
		if a.ml != nil {
			if graceful {
				_ = a.ml.Leave(2 * time.Second)
			}
			_ = a.ml.Shutdown()
		}
		if a.http != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = a.http.Shutdown(ctx)
			cancel()
		} else if a.httpLn != nil {
			_ = a.httpLn.Close()
		}
		if a.par != nil {
			a.par.Close() // the drivers end their requests before the endpoint closes
		}
		if a.srv != nil {
			if err := a.srv.Shutdown(); err != nil {
				a.log.Warn("raft shutdown", zap.Error(err))
			}
		}
		if a.ep != nil {
			_ = a.ep.Close()
		}
		a.bg.Wait()
		if a.files != nil {
			a.files.close()
		}
		a.log.Info("agent stopped", zap.Bool("graceful", graceful))
	})
}

// joinLoop joins gossip through the seeds and --join addresses, retrying
// until it succeeds or the agent stops, then keeps the peer list on disk
// for restarts.
func (a *Agent) joinLoop() {
	defer a.bg.Done()
	peersFile := filepath.Join(a.cfg.DataDir, "peers.json")
	var saved []string
	if b, err := os.ReadFile(peersFile); err == nil {
		_ = json.Unmarshal(b, &saved)
	}
	backoff := 200 * time.Millisecond
	joined := len(a.cfg.Join) == 0 && len(a.seeds) == 0 && len(saved) == 0
	for attempt := 0; !joined; attempt++ {
		seeds := append(append([]string{}, a.seeds...), saved...)
		for _, j := range a.cfg.Join {
			addr, _ := joinAddr(j)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var got []string
			if err := transport.Call(ctx, a.ep, addr, transport.KindRPC, "Cluster.Seeds", nil, &got); err == nil {
				seeds = append(seeds, got...)
			} else if attempt%10 == 9 {
				a.log.Warn("cannot reach join address yet", zap.String("addr", addr), zap.Error(err))
			}
			cancel()
		}
		var others []string
		self := a.GossipAddr()
		for _, s := range seeds {
			if s != self {
				others = append(others, s)
			}
		}
		if len(others) > 0 {
			if n, err := a.ml.Join(others); n > 0 {
				a.log.Info("joined gossip", zap.Int("contacted", n))
				joined = true
				break
			} else if attempt%10 == 9 {
				a.log.Warn("gossip join failed; retrying", zap.Error(err))
			}
		} else if len(a.cfg.Join) == 0 {
			break
		}
		select {
		case <-a.done:
			return
		case <-time.After(backoff):
		}
		if backoff < 2*time.Second {
			backoff *= 2
		}
	}
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		var addrs []string
		for _, m := range a.gossip.Members() {
			if m.Status == coordinator.StatusAlive && m.ID != a.id {
				addrs = append(addrs, m.Addr)
			}
		}
		if len(addrs) > 0 {
			b, _ := json.Marshal(addrs)
			_ = os.WriteFile(peersFile, b, 0o600)
		}
		select {
		case <-a.done:
			return
		case <-t.C:
		}
	}
}

// onLeader seeds the state with the bootstrap secret's hash, so every
// server can check it as a join token and API key.
func (a *Agent) onLeader() {
	if a.bootstrapSecret == "" {
		return
	}
	var have bool
	a.srv.FSM().View(func(st *coordinator.State) { _, have = st.Tokens[coordinator.TokenBootstrap] })
	if have {
		return
	}
	tok := coordinator.Token{
		ID: coordinator.TokenBootstrap, Kind: coordinator.TokenBootstrap, SecretHash: hashSecret(a.bootstrapSecret),
		Description: "shared by the bootstrap servers", CreatedAt: time.Now().UTC(),
	}
	if err := a.srv.Apply(coordinator.TokenCreateType, coordinator.TokenCreateRequest{Token: tok}, 5*time.Second); err != nil {
		a.log.Warn("storing the bootstrap token", zap.Error(err))
	}
}

func (a *Agent) peerHasState(ctx context.Context, m coordinator.Member) (bool, error) {
	var has bool
	err := transport.Call(ctx, a.ep, m.RPCAddr, transport.KindRPC, "Cluster.HasState", nil, &has)
	return has, err
}

// joinRequest is what a node without a certificate sends on a join stream.
type joinRequest struct {
	Token     string `json:"token"`
	NodeID    string `json:"node_id"`
	Name      string `json:"name"`
	Role      string `json:"role"`
	PublicKey []byte `json:"public_key"`
}

type joinResponse struct {
	Err       string   `json:"err,omitempty"`
	Code      int      `json:"code,omitempty"`
	CACert    []byte   `json:"ca_cert,omitempty"`
	CAKey     []byte   `json:"ca_key,omitempty"` // servers only
	Cert      []byte   `json:"cert,omitempty"`
	GossipKey []byte   `json:"gossip_key,omitempty"`
	Seeds     []string `json:"seeds,omitempty"`
}

const maxJoinFrame = 64 << 10

func (a *Agent) joinWithToken(ctx context.Context, token string) error {
	_, _, caHash, _ := parseToken(token)
	if len(a.cfg.Join) == 0 {
		return errors.New("a join token needs --join with the address of a server")
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	req, _ := json.Marshal(joinRequest{Token: token, NodeID: a.id, Name: a.cfg.Name, Role: a.role, PublicKey: pub})
	deadline := time.Now().Add(a.cfg.Tuning.JoinTimeout.or(5 * time.Minute))
	var last error
	for backoff := 200 * time.Millisecond; time.Now().Before(deadline); {
		for _, j := range a.cfg.Join {
			addr, _ := joinAddr(j)
			resp, err := joinOnce(ctx, addr, caHash, req)
			if err != nil {
				last = err
				continue
			}
			if resp.Err != "" {
				last = fmt.Errorf("join refused by %s: %s", addr, resp.Err)
				if resp.Code == http.StatusForbidden || resp.Code == http.StatusBadRequest {
					return last
				}
				continue
			}
			return a.acceptJoin(resp, caHash, key)
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

func joinOnce(ctx context.Context, addr, caHash string, req []byte) (*joinResponse, error) {
	st, done, err := transport.DialPinned(ctx, addr, caHash, transport.KindJoin, 3*time.Second)
	if err != nil {
		return nil, err
	}
	defer done()
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	if err := transport.WriteFrame(st, req); err != nil {
		return nil, err
	}
	_ = st.CloseWrite()
	b, err := transport.ReadFrame(st, maxJoinFrame)
	if err != nil {
		return nil, fmt.Errorf("join %s: %w", addr, err)
	}
	var resp joinResponse
	if err := json.Unmarshal(b, &resp); err != nil {
		return nil, fmt.Errorf("join %s: malformed answer", addr)
	}
	return &resp, nil
}

func (a *Agent) acceptJoin(resp *joinResponse, caHash string, key ed25519.PrivateKey) error {
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
	if len(resp.GossipKey) != 32 {
		return errors.New("join: the server sent no gossip key")
	}
	a.gossipKey = resp.GossipKey
	a.seeds = resp.Seeds
	a.log.Info("joined the cluster with a token; certificate issued")
	return nil
}

// serveJoin answers a join stream: servers pass it to the leader, which
// checks the token and signs the certificate.
func (a *Agent) serveJoin(st *transport.Stream) {
	defer st.Close()
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := transport.ReadFrame(st, maxJoinFrame)
	if err != nil {
		return
	}
	var req joinRequest
	var resp *joinResponse
	if err := json.Unmarshal(b, &req); err != nil {
		resp = &joinResponse{Err: "malformed join request", Code: http.StatusBadRequest}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		resp = a.handleJoin(ctx, &req, false)
		cancel()
	}
	if resp.Err != "" {
		a.log.Warn("refused join", zap.String("from", st.Peer.Addr.String()), zap.String("name", req.Name), zap.String("reason", resp.Err))
	}
	out, _ := json.Marshal(resp)
	_ = transport.WriteFrame(st, out)
}

func (a *Agent) handleJoin(ctx context.Context, req *joinRequest, forwarded bool) *joinResponse {
	fail := func(err error) *joinResponse { return &joinResponse{Err: err.Error(), Code: transport.StatusOf(err)} }
	if a.srv == nil {
		return &joinResponse{Err: fmt.Sprintf("agent %s is a client: --join a server", a.cfg.Name), Code: http.StatusBadRequest}
	}
	if !a.srv.IsLeader() {
		_, addr := a.srv.Leader()
		if addr == "" || forwarded {
			return &joinResponse{Err: "no cluster leader yet", Code: http.StatusServiceUnavailable}
		}
		var resp joinResponse
		if err := transport.Call(ctx, a.ep, addr, transport.KindRPC, "Cluster.Join", req, &resp); err != nil {
			return fail(err)
		}
		return &resp
	}
	if _, err := checkToken(a.srv.FSM().State(), req.Token, time.Now(), coordinator.TokenJoin, coordinator.TokenBootstrap); err != nil {
		return fail(err)
	}
	if len(req.PublicKey) != ed25519.PublicKeySize || len(req.NodeID) != 36 {
		return &joinResponse{Err: "join request without a valid node ID and ed25519 public key", Code: http.StatusBadRequest}
	}
	cert, err := a.ident.CA.Issue(ed25519.PublicKey(req.PublicKey), req.NodeID, req.Role)
	if err != nil {
		return &joinResponse{Err: err.Error(), Code: http.StatusBadRequest}
	}
	resp := &joinResponse{CACert: a.ident.CA.DER, Cert: cert, GossipKey: a.gossipKey, Seeds: a.aliveGossipAddrs()}
	if req.Role == coordinator.RoleServer {
		if resp.CAKey, err = marshalPKCS8(a.ident.CA.Key); err != nil {
			return fail(err)
		}
	}
	a.log.Info("admitted node", zap.String("name", req.Name), zap.String("id", req.NodeID), zap.String("role", req.Role))
	return resp
}

func (a *Agent) aliveGossipAddrs() []string {
	out := []string{a.GossipAddr()}
	for _, m := range a.gossip.Members() {
		if m.Status == coordinator.StatusAlive && m.ID != a.id {
			out = append(out, m.Addr)
		}
	}
	return out
}
