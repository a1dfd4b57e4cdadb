package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/catalog"
	"shoal/coordinator"
	"shoal/node/identity"
	"shoal/transport"
)

// RPC methods of the agent besides the coordinator client's.
const (
	methodSeeds    = "Cluster.Seeds"
	methodStatus   = "Cluster.Status"
	methodCheckKey = "Cluster.CheckKey"
)

// checkKeyRequest asks a server whether an API key has a scope: client
// agents, which see no token hashes, check keys this way.
type checkKeyRequest struct {
	Key   string    `json:"key"`
	Scope api.Scope `json:"scope"`
}

// keyGrant is what a server says of a key that has the scope.
type keyGrant struct {
	Kind   string   `json:"kind,omitempty"`
	Models []string `json:"models,omitempty"`
}

// registerRPC wires the agent's RPC methods to the parts that answer them.
func (a *Agent) registerRPC() {
	server := func(h transport.RPCHandler) transport.RPCHandler {
		return func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
			if a.srv == nil {
				return nil, &coordinator.Error{Code: http.StatusBadRequest, Msg: fmt.Sprintf("agent %s is not a server", a.cfg.Name)}
			}
			return h(ctx, p, body)
		}
	}
	a.registerHello()
	a.rpc.Register(methodSeeds, func(ctx context.Context, p transport.Peer, _ json.RawMessage) (any, error) {
		return a.aliveGossipAddrs(), nil
	})
	for _, method := range coordinator.ServerMethods {
		a.rpc.Register(method, server(func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
			return a.cluster.Handle(ctx, clusterPeer(p), method, body)
		}))
	}
	a.rpc.Register(methodCheckKey, server(func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
		var req checkKeyRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, badRequest("malformed key check")
		}
		tok, err := a.admin.grant(ctx, req.Key, req.Scope)
		if err != nil || tok == nil {
			return keyGrant{}, err
		}
		return keyGrant{Kind: tok.Kind, Models: tok.Models}, nil
	}))
	a.rpc.Register(methodStatus, server(func(ctx context.Context, p transport.Peer, _ json.RawMessage) (any, error) {
		return a.admin.Status(ctx)
	}))
	a.rpc.Register(identity.MethodJoin, server(func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
		return a.join.Forwarded(ctx, body)
	}))
	a.rpc.Register(coordinator.MethodLeave, func(ctx context.Context, p transport.Peer, _ json.RawMessage) (any, error) {
		if p.Role != transport.RoleServer {
			return nil, forbidden("only servers may ask a node to leave")
		}
		a.log.Warn("removed from the cluster by an operator; leaving", zap.String("by", p.ID))
		go a.close(true)
		return nil, nil
	})
	a.rpc.Register(catalog.MethodLoadModel, func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
		var req catalog.LoadRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, badRequest("malformed load request")
		}
		if p.Role != transport.RoleServer {
			// A client agent relays an operator's request to a server,
			// which checks the admin key and asks the node with the file.
			if a.srv == nil {
				return nil, forbidden("only a server takes a model load from a client node")
			}
			if err := a.admin.Authorize(ctx, req.Key, api.ScopeAdmin); err != nil {
				return nil, forbidden("loading a model needs an admin key")
			}
			return a.admin.LoadModel(ctx, req.LoadModelRequest)
		}
		req.Node = "" // a server asks this node to register a file it holds
		return a.admin.LoadModel(ctx, req.LoadModelRequest)
	})
	a.catalog.RegisterRPC(a.rpc)
}

// clusterPeer is the caller of a cluster method as its certificate and
// connection say.
func clusterPeer(p transport.Peer) coordinator.Peer {
	cp := coordinator.Peer{ID: p.ID, Role: p.Role, Name: p.Name}
	if p.Addr != nil {
		cp.Addr = p.Addr.String()
	}
	return cp
}
