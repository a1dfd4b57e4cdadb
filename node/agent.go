package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"shoal/api"
	"shoal/api/openai"
	"shoal/catalog"
	"shoal/coordinator"
	"shoal/disagg"
	"shoal/engine/device"
	"shoal/engine/device/vulkan"
	"shoal/gateway"
	"shoal/node/fingerprint"
	"shoal/node/identity"
	"shoal/node/links"
	"shoal/node/membership"
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
	dev             device.Device   // runs this node's layers (--device)
	devLine         string          // what --device chose, and why
	meta            membership.Meta // what this agent gossips, and answers Node.Hello with (under metaMu once started)
	metaMu          sync.Mutex

	ep     *transport.Endpoint
	rpc    *transport.RPCServer
	gossip *membership.Gossip
	ml     *memberlist.Memberlist
	srv    *coordinator.Server
	// cluster reads and writes the state through the leader; admin is the
	// admin API's backend; join admits new nodes; fwd passes requests to
	// the agents that drive their model.
	cluster *coordinator.Client
	admin   *admin
	join    *identity.Admission
	fwd     *gateway.Forwarder
	http    *http.Server
	httpLn  net.Listener
	https   *identity.HTTPS // nil when the API is plain HTTP
	advIP   string
	seeds   []string

	// catalog holds the model files this node has and serves to peers,
	// the copies it keeps for the cluster and the models it registers.
	catalog *catalog.Catalog
	shards  *shard.Manager // the shards the plans give this node

	par *parallel.Reconciler // members and drivers of the plans this node is in
	// kvLink carries disaggregated prefill's KV caches (kv streams).
	kvLink *disagg.Link
	// net counts the traffic to and from each peer (eBPF or QUIC's counts).
	net *links.Traffic

	models *openai.StaticBackend // models this agent serves (the OpenAI endpoint's backend)
	// encoders are the embedding models among the --model files, served
	// whole here; encoderClosers release them.
	encoders       []gateway.Embedding
	encoderClosers []func() error
	pub            *publisher // puts the models this node drives into models
	registry       *prometheus.Registry
	observer       openai.Observer

	revoked atomic.Pointer[map[string]bool] // a client's copy of the revoked node IDs
	fsm     atomic.Pointer[coordinator.FSM] // a server's state, once its Raft runs (read by the endpoint and gossip from their goroutines)
	// lastState is the state a client agent's serving loop read last.
	lastState atomic.Pointer[coordinator.State]
	// catchingUp: the serving loop said it waits for the cluster's state.
	catchingUp atomic.Bool
	// lingers tracks the replaced plans that run on (serving loop only).
	lingers parallel.Lingers

	life lifecycle

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
	a.life.ready = make(chan struct{})
	if cfg.Server {
		a.role = coordinator.RoleServer
	}
	var err error
	if a.id, err = identity.LoadNodeID(cfg.DataDir); err != nil {
		return nil, err
	}
	a.log = zap.L().Named("agent").With(zap.String("node", cfg.Name))
	if err := a.setupIdentity(ctx); err != nil {
		return nil, err
	}
	if a.dev, a.devLine, err = vulkan.Choose(cfg.Device); err != nil {
		return nil, fmt.Errorf("--device: %w", err)
	}
	a.log.Info("device", zap.String("device", a.devLine))
	m := fingerprint.Probe(cfg.DataDir, cfg.Version, cfg.Tuning.ProbeDuration.Or(300*time.Millisecond), cfg.Threads)
	a.caps = coordinator.Capabilities{MemTotal: m.MemTotal, MemFree: m.MemFree, Cores: m.Cores, GFLOPS: m.GFLOPS, MemGBps: m.MemGBps,
		Accel: m.Accel, Serves: cfg.Serves}
	if err := a.gpuCaps(cfg.Tuning.ProbeDuration.Or(300 * time.Millisecond)); err != nil {
		return nil, err
	}
	if l := cfg.MemoryLimit; l > 0 {
		// Advertise no more than the operator allows models to use.
		a.caps.MemTotal, a.caps.MemFree = min(a.caps.MemTotal, l), min(a.caps.MemFree, l)
	}
	local, err := a.localRequests()
	if err != nil {
		return nil, err
	}
	if err := a.setupHTTPS(); err != nil {
		return nil, err
	}
	if err := a.start(); err != nil {
		a.close(false)
		return nil, err
	}
	a.log.Info("agent started", zap.String("id", a.id), zap.String("role", a.role),
		zap.String("quic", a.RPCAddr()), zap.String("gossip", a.GossipAddr()), zap.String("api", a.HTTPURL()))
	a.bg.Add(7)
	go a.remeasureLoop()
	go a.predictionLoop()
	go a.readyLoop()
	go a.registerLocal(local)
	go a.joinLoop()
	go a.servingLoop()
	go a.linkLoop()
	if a.clusterCert() {
		a.bg.Add(1)
		go a.httpsLoop()
	}
	if a.srv != nil {
		a.bg.Add(1)
		go a.httpsCALoop()
	}
	if cfg.BootstrapExpect == 1 {
		a.awaitHTTPS(ctx, 30*time.Second)
		a.awaitLocal(ctx, 30*time.Second)
	}
	return a, nil
}

func (a *Agent) start() error {
	var err error
	a.ep, err = transport.Listen(transport.Config{
		Bind:     net.JoinHostPort(orDefault(a.cfg.Bind, "0.0.0.0"), strconv.Itoa(a.cfg.QUICPort)),
		Identity: a.ident, Protocols: a.protocols(), Build: a.cfg.Version,
	})
	if err != nil {
		return err
	}
	a.ep.SetRevoked(a.isRevoked)
	// The RPC methods and the join handler read gossip and Raft state, so
	// they are registered below, once both exist; a peer calling earlier
	// gets "unknown method" and retries.
	a.rpc = transport.NewRPCServer(a.ep, transport.KindRPC, rpcTimeout)

	// The HTTP listener comes first so its port can ride in gossip meta.
	a.httpLn, err = net.Listen("tcp", net.JoinHostPort(orDefault(a.cfg.Bind, "0.0.0.0"), strconv.Itoa(a.cfg.HTTPPort)))
	if err != nil {
		return fmt.Errorf("http listen: %w", err)
	}
	a.meta = membership.Meta{
		Name: a.cfg.Name, Role: a.role, Version: a.cfg.Version, Proto: a.protocols().Max,
		QUIC: a.ep.Addr().Port, HTTP: a.httpLn.Addr().(*net.TCPAddr).Port, Expect: a.cfg.BootstrapExpect,
		Mem: a.caps.MemTotal, Free: a.caps.MemFree, Cores: a.caps.Cores, GFLOPS: a.caps.GFLOPS, GBps: a.caps.MemGBps, Accel: a.caps.Accel, Serves: a.caps.Serves,
		GPU: a.caps.GPU, GPUMem: a.caps.GPUMem, GPUGBps: a.caps.GPUGBps, GPUShared: a.caps.GPUShared,
	}
	if a.net, err = links.StartTraffic(a.cfg.NetTelemetry, a.ep, a.log.Named("net")); err != nil {
		return fmt.Errorf("--net-telemetry %s: %w", a.cfg.NetTelemetry, err)
	}
	a.gossip, err = membership.Start(a.meta, membership.Options{
		ID: a.id, Bind: orDefault(a.cfg.Bind, "0.0.0.0"), Port: a.cfg.GossipPort, Advertise: a.cfg.Advertise,
		Key: a.gossipKey, Probe: a.cfg.Tuning.GossipProbe.Or(0), Revoked: a.isRevoked, Protocols: a.protocols(),
		// Count a peer's traffic from its first packets (a shard fetch can
		// follow its join within a second), not from the link loop's next tick.
		Joined: func(id string, ip net.IP) {
			if addr, ok := netip.AddrFromSlice(ip); ok && id != a.id {
				go a.net.Watch([]netip.Addr{addr.Unmap()})
			}
		},
	})
	if err != nil {
		return err
	}
	a.ml = a.gossip.Memberlist()
	a.advIP = a.ml.LocalNode().Addr.String()

	if a.cfg.Server {
		adv := &net.UDPAddr{IP: net.ParseIP(a.advIP), Port: a.ep.Addr().Port}
		rt := a.cfg.Tuning.RaftTimeout.Or(500 * time.Millisecond)
		a.srv, err = coordinator.NewServer(coordinator.Config{
			NodeID: a.id, DataDir: a.cfg.DataDir, Layer: transport.NewRaftLayer(a.ep, adv), Members: a.gossip,
			Bootstrap:           a.cfg.BootstrapExpect,
			PeerHasState:        a.peerHasState,
			Certify:             a.certify,
			OnLeader:            a.onLeader,
			HeartbeatTimeout:    rt,
			ElectionTimeout:     rt,
			LeaderLeaseTimeout:  rt / 2,
			ReconcileInterval:   a.cfg.Tuning.ReconcileInterval.Or(2 * time.Second),
			DeadServerGrace:     a.cfg.Tuning.DeadServerGrace.Or(30 * time.Second),
			ServerStabilization: a.cfg.Tuning.ServerStabilization.Or(2 * time.Second),
			SnapshotThreshold:   a.cfg.Tuning.SnapshotThreshold,
			SnapshotInterval:    a.cfg.Tuning.SnapshotInterval.Or(0),
		})
		if err != nil {
			return err
		}
		a.fsm.Store(a.srv.FSM())
	}
	a.cluster = coordinator.NewClient(a.srv, a.gossip, serverCaller(a.ep), a.log)
	a.cluster.CallNode = nodeCaller(a.ep)
	a.cluster.Certified = a.certifiedServer
	a.catalog = a.newCatalog()
	a.admin = a.newAdmin()
	a.cluster.KeyOf = api.KeyFrom
	if a.srv != nil {
		a.cluster.CheckAdmin = func(key string) error { return a.admin.Authorize(context.Background(), key, api.ScopeAdmin) }
	}
	a.join = a.newAdmission()
	a.registerRPC()
	a.ep.Handle(transport.KindJoin, a.join.Serve)
	transport.ServeWeights(a.ep, a.catalog.WeightSource(), transport.WeightsOptions{})
	transport.ServeProbe(a.ep, 0)
	a.models = openai.NewStaticBackend()
	if err := a.serveEncoders(); err != nil {
		return err
	}
	a.startServing()
	if err := a.setupMetrics(); err != nil {
		return err
	}
	a.fwd = a.newForwarder()
	a.startGateway()
	a.http = newHTTPServer(a.httpHandler(), a.cfg.Tuning.HTTPBody.Or(httpBodyTimeout), a.log)
	a.fwd.ServeForwarded(a.http.Handler) // requests peers pass on take the same routes
	if a.https != nil {
		// GetCertificate: the server starts before the cluster has signed
		// the node's certificate; handshakes fail until it has.
		a.http.TLSConfig = &tls.Config{GetCertificate: a.https.GetCertificate, MinVersion: tls.VersionTLS12}
		go func() { _ = a.http.ServeTLS(a.httpLn, "", "") }()
	} else {
		go func() { _ = a.http.Serve(a.httpLn) }()
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
