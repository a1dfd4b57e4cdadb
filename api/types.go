package api

import (
	"context"
	"time"

	"shoal/coordinator"
)

// Status is the answer of GET /v1/status.
type Status struct {
	Node             string         `json:"node"`      // the answering agent's ID
	NodeName         string         `json:"node_name"` // and name
	Role             string         `json:"role"`
	Leader           string         `json:"leader"` // leader node ID, empty when none
	LeaderName       string         `json:"leader_name"`
	LeaderAddr       string         `json:"leader_addr"`
	Health           string         `json:"health"` // healthy, degraded or no-leader
	FailureTolerance int            `json:"failure_tolerance"`
	Servers          []ServerStatus `json:"servers"`
	Nodes            int            `json:"nodes"`
	NodesAlive       int            `json:"nodes_alive"`
	Index            uint64         `json:"index"`
}

// ServerStatus is one Raft server.
type ServerStatus struct {
	ID      string                 `json:"id"`
	Name    string                 `json:"name"`
	Address string                 `json:"address"`
	Voter   bool                   `json:"voter"`
	Leader  bool                   `json:"leader"`
	Status  coordinator.NodeStatus `json:"status"`
}

// Member is one entry of the raw gossip view.
type Member struct {
	ID      string                   `json:"id"`
	Name    string                   `json:"name"`
	Addr    string                   `json:"addr"`
	RPCAddr string                   `json:"rpc_addr"`
	Role    string                   `json:"role"`
	Status  coordinator.NodeStatus   `json:"status"`
	Version string                   `json:"version"`
	Caps    coordinator.Capabilities `json:"caps"`
}

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	Kind        string `json:"kind"` // join (default) or admin
	Description string `json:"description,omitempty"`
	TTL         string `json:"ttl,omitempty"` // Go duration; empty never expires
}

// NewToken is a freshly created token; Secret is shown only once.
type NewToken struct {
	coordinator.Token
	Secret string `json:"token"`
}

// Backend is what the node provides to the API.
type Backend interface {
	// Authorize checks an API key.
	Authorize(ctx context.Context, key string) error
	Status(ctx context.Context) (*Status, error)
	Nodes(ctx context.Context) ([]*coordinator.Node, error)
	Drain(ctx context.Context, id string, drain bool) error
	RemoveNode(ctx context.Context, id string) error
	Members(ctx context.Context) ([]Member, error)
	CreateToken(ctx context.Context, kind, description string, ttl time.Duration) (*NewToken, error)
	Tokens(ctx context.Context) ([]*coordinator.Token, error)
	RevokeToken(ctx context.Context, id string) error
}
