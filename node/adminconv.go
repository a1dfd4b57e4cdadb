package node

import (
	"shoal/api"
	"shoal/coordinator"
	"shoal/internal/version"
	"shoal/placement"
)

// The admin API has wire types of its own; these convert the cluster
// state into them.

func apiCaps(c coordinator.Capabilities) api.Capabilities {
	return api.Capabilities{MemTotal: c.MemTotal, MemFree: c.MemFree, Cores: c.Cores, GFLOPS: c.GFLOPS, MemGBps: c.MemGBps, Accel: c.Accel, Serves: c.Serves,
		GPU: c.GPU, GPUMem: c.GPUMem, GPUGBps: c.GPUGBps, GPUShared: c.GPUShared}
}

func apiNode(n *coordinator.Node) *api.Node {
	return &api.Node{
		ID: n.ID, Name: n.Name, Role: n.Role, Addr: n.Addr, RPCAddr: n.RPCAddr, HTTPAddr: n.HTTPAddr, Version: n.Version, Protocol: version.Of(n.Protocol),
		Status: string(n.Status), Draining: n.Draining, Caps: apiCaps(n.Caps), RegisteredAt: n.RegisteredAt, StatusSince: n.StatusSince,
	}
}

func apiNodes(ns []*coordinator.Node) []*api.Node {
	out := make([]*api.Node, 0, len(ns))
	for _, n := range ns {
		out = append(out, apiNode(n))
	}
	return out
}

func apiToken(t *coordinator.Token) api.Token {
	return api.Token{
		ID: t.ID, Kind: t.Kind, Models: t.Models, Role: t.Role, SecretHash: t.SecretHash, Description: t.Description,
		CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, Revoked: t.Revoked, RevokedAt: t.RevokedAt, RotatedAt: t.RotatedAt,
	}
}

func apiTokens(ts []*coordinator.Token) []*api.Token {
	out := make([]*api.Token, 0, len(ts))
	for _, t := range ts {
		at := apiToken(t)
		out = append(out, &at)
	}
	return out
}

func apiCost(c placement.Cost) api.Cost {
	return api.Cost{MsPerToken: c.MsPerToken, ComputeMs: c.ComputeMs, MemoryMs: c.MemoryMs, NetworkMs: c.NetworkMs, BottleneckMs: c.BottleneckMs}
}

func apiPlacementMember(m placement.Member, name string) api.PlacementMember {
	return api.PlacementMember{
		Node: m.Node, TPRank: m.TPRank, TPSize: m.TPSize, HeadLo: m.HeadLo, HeadHi: m.HeadHi, FFNLo: m.FFNLo, FFNHi: m.FFNHi,
		Experts: m.Experts, Embedding: m.Embedding, Output: m.Output, MemBytes: m.MemBytes, KVBytes: m.KVBytes, Ms: m.Ms, NodeName: name,
		GPULayers: m.GPULayers,
	}
}
