package node

import (
	"context"

	"shoal/api"
	"shoal/catalog"
	"shoal/hub"
)

// ReplicasDir is where the copies of model files this node keeps for the
// cluster live, below the data dir.
const ReplicasDir = catalog.ReplicasDir

// newCatalog wires the model catalog: this node's model files, the
// copies it keeps, the models it registers and the hub checks it runs.
func (a *Agent) newCatalog() *catalog.Catalog {
	d := catalog.Deps{
		ID: a.id, Name: a.cfg.Name, DataDir: a.cfg.DataDir, DiskLimit: a.cfg.DiskLimit, DiskFree: a.diskFree,
		Log: a.log, Cluster: a.cluster, Server: a.srv != nil, Call: serverCaller(a.ep), CallNode: nodeCaller(a.ep),
		ResolveNode: func(ctx context.Context, ref string) (*api.Node, error) { return a.admin.resolveNode(ctx, ref) },
		Endpoint:    a.ep,
		Shards: func() catalog.Shards {
			if a.shards == nil {
				return nil
			}
			return a.shards
		},
		Hub: a.hubClient, BG: &a.bg, Done: a.done,
	}
	if a.srv != nil {
		d.IsLeader = a.srv.IsLeader
	}
	return catalog.New(d)
}

// hubClient is the agent's hub client: Config.Hub, or one configured
// from the environment (HF_ENDPOINT, HF_TOKEN), with the agent's name in
// the User-Agent.
func (a *Agent) hubClient() *hub.Client {
	var c hub.Client
	if a.cfg.Hub != nil {
		c = *a.cfg.Hub
	} else {
		c = *hub.NewClient()
	}
	if c.UserAgent == "" {
		c.UserAgent = "shoal/" + a.cfg.Name
	}
	return &c
}
