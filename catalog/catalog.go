package catalog

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
	"shoal/hub"
	"shoal/shard"
	"shoal/transport"
)

// Cluster reads and writes the cluster state (coordinator.Client).
type Cluster interface {
	State(ctx context.Context) (*coordinator.State, error)
	Apply(ctx context.Context, t coordinator.MessageType, req any) error
	ServerAddr() (string, error)
}

// Shards is what the catalog uses of the node's shard manager
// (shard.Manager): the manifests of the files it holds ranges of, and
// those ranges.
type Shards interface {
	Manifest(fileSHA string) ([]byte, bool)
	KeepManifest(fileSHA string, raw []byte)
	Holdings(fileSHA string) (*shard.HeldReader, bool)
}

// Deps is what the catalog takes from the agent that runs it.
type Deps struct {
	ID, Name string // this node
	DataDir  string // files.json, manifests/ and replicas/ live here
	// DiskLimit bounds the bytes of the copies this node keeps (0: the
	// disk's free space); DiskFree reports a folder's free disk (nil:
	// unknown).
	DiskLimit uint64
	DiskFree  func(dir string) (uint64, bool)
	Log       *zap.Logger

	Cluster Cluster
	// Server tells whether this agent is a server; IsLeader whether it
	// leads now (nil on a client agent). The leader takes over the hub
	// check of a model whose loading agent is gone.
	Server   bool
	IsLeader func() bool
	// Call reaches servers, CallNode any node (by an address tagged with
	// its ID): a load of a file on another node is passed to it.
	Call, CallNode coordinator.Caller
	// ResolveNode finds a node of the state by name or ID.
	ResolveNode func(ctx context.Context, ref string) (*api.Node, error)
	// Endpoint reaches the peers: the Weights RPCs and the weights stream.
	Endpoint *transport.Endpoint
	// Shards is the shard manager, nil until it is made.
	Shards func() Shards
	// Hub makes a hub client (nil: this agent reaches no hub).
	Hub func() *hub.Client

	BG   *sync.WaitGroup // the agent's background work (hashing, hub checks)
	Done <-chan struct{} // closed when the agent stops
}

// Catalog is one node's part of the model catalog: the model files it has
// and serves to peers, the copies it keeps for the cluster, the models it
// registers (by path or hub reference) and the hub checks it runs.
type Catalog struct {
	id, name string
	log      *zap.Logger
	server   bool
	isLeader func() bool
	cluster  Cluster
	call     coordinator.Caller // to servers
	callNode coordinator.Caller // to any node, by a tagged address
	resolve  func(ctx context.Context, ref string) (*api.Node, error)
	shards   func() Shards
	hub      func() *hub.Client

	files   *fileRegistry // model files this node has and serves to peers
	layouts signedLayouts
	// peers reaches the nodes' files and shard ranges.
	peers  shard.Peers
	copies *replicator // the copies of model files this node keeps for the cluster

	// hubChecks are the hub models whose check runs here (name → its
	// unverified manifest and the cancel of its check).
	hubMu     sync.Mutex
	hubChecks map[string]*hubCheck

	bg   *sync.WaitGroup
	done <-chan struct{}
}

// New opens this node's file registry (what files.json lists, each file
// checked unchanged) and its copies.
func New(d Deps) *Catalog {
	c := &Catalog{
		id: d.ID, name: d.Name, log: d.Log.Named("catalog"), server: d.Server, isLeader: d.IsLeader, cluster: d.Cluster,
		call: d.Call, callNode: d.CallNode, resolve: d.ResolveNode, shards: d.Shards, hub: d.Hub,
		peers: peers{d.Endpoint}, bg: d.BG, done: d.Done,
	}
	c.files = openFileRegistry(d.DataDir, d.Log)
	c.copies = newReplicator(d.ID, d.DataDir, c.files, c.peers, d.DiskLimit, d.DiskFree, d.Log.Named("copies"))
	c.copies.report = c.reportHolder
	return c
}

// Files are the model files this node has (the shard manager reads the
// ranges of its shards from them).
func (c *Catalog) Files() shard.LocalFiles { return c.files }

// Peers reaches the nodes with a model file or its ranges.
func (c *Catalog) Peers() shard.Peers { return c.peers }

// HubRanges reads the file of a shard.Want's hub origin.
func (c *Catalog) HubRanges(origin string) shard.RangeFetcher {
	return newHubFetcher(c.hub(), origin)
}

// RegisterRPC answers the Weights RPCs (Layout, Holdings) on rpc.
func (c *Catalog) RegisterRPC(rpc *transport.RPCServer) {
	rpc.Register(MethodLayout, c.serveLayout)
	rpc.Register(MethodHoldings, c.serveHoldings)
}

// WeightSource serves the weights stream: the files this node has and,
// for a file it has not, the ranges its shards hold.
func (c *Catalog) WeightSource() transport.WeightSource { return weightSource{c} }

// Reconcile acts on a new state: it removes the copies no model has,
// starts those this node should make and resumes the hub checks this node
// should run.
func (c *Catalog) Reconcile(st *coordinator.State) {
	c.copies.reconcile(st)
	c.resumeHubChecks(st)
}

// StopCopies stops the copies under way and waits for them.
func (c *Catalog) StopCopies() { c.copies.close() }

// Close closes the files this node serves.
func (c *Catalog) Close() { c.files.close() }

// shardStore is the shard manager, nil before it is made.
func (c *Catalog) shardStore() Shards {
	if c.shards == nil {
		return nil
	}
	return c.shards()
}

// reportHolder records this node's copy of a model's file in the state.
func (c *Catalog) reportHolder(ctx context.Context, model string, h coordinator.ModelHolder) error {
	return c.cluster.Apply(ctx, coordinator.ModelHolderType|coordinator.IgnoreUnknownTypeFlag, coordinator.ModelHolderRequest{Model: model, Holder: h})
}

// leader tells whether this agent leads the cluster now.
func (c *Catalog) leader() bool { return c.server && c.isLeader != nil && c.isLeader() }

// RPC methods of the catalog.
const (
	MethodLoadModel = "Models.Load"
	MethodLayout    = "Weights.Layout"
	MethodHoldings  = "Weights.Holdings"
)

// LoadRequest is Models.Load's body: a server asking the node that holds
// a file to register it, or a client agent relaying an operator's
// request, with the operator's admin key, to a server.
type LoadRequest struct {
	api.LoadModelRequest
	Key string `json:"key,omitempty"`
}

func badRequest(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...)}
}

func notFoundErr(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf(format, args...)}
}
