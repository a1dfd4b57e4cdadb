package node

import (
	"context"
	"time"

	"shoal/coordinator"
	"shoal/internal/version"
	"shoal/node/config"
	"shoal/node/identity"
)

// Identity and secure join are node/identity's: this file wires them.

// setupIdentity loads the node's certificate, or creates it: from the
// bootstrap secret (servers agree on a CA) or by joining with a token
// (identity.Setup).
func (a *Agent) setupIdentity(ctx context.Context) error {
	join := make([]string, 0, len(a.cfg.Join))
	for _, j := range a.cfg.Join {
		addr, _ := config.JoinAddr(j)
		join = append(join, addr)
	}
	n, err := identity.Setup(ctx, identity.Config{
		DataDir: a.cfg.DataDir, ID: a.id, Name: a.cfg.Name, Role: a.role,
		Server: a.cfg.Server, BootstrapExpect: a.cfg.BootstrapExpect,
		Token: a.cfg.Token, Join: join, Bind: a.cfg.Bind, QUICPort: a.cfg.QUICPort,
		JoinTimeout: a.cfg.Tuning.JoinTimeout.Or(5 * time.Minute), Log: a.log,
		Protocols: a.cfg.Protocols, Build: a.cfg.Version,
	})
	if err != nil {
		return err
	}
	a.id, a.ident, a.gossipKey, a.bootstrapSecret, a.seeds = n.ID, n.Cert, n.GossipKey, n.BootstrapSecret, n.Seeds
	return nil
}

// newAdmission wires the join handler.
func (a *Agent) newAdmission() *identity.Admission {
	return identity.NewAdmission(identity.AdmissionConfig{
		ID: a.id, Name: a.cfg.Name, Server: a.srv, CA: a.ident.CA, GossipKey: a.gossipKey,
		BootstrapSecret: a.bootstrapSecret, Call: serverCaller(a.ep), Seeds: a.aliveGossipAddrs,
		CheckToken: checkToken, Log: a.log, Protocols: a.protocols(), Build: a.cfg.Version,
	})
}

// protocols is the window of protocols the agent speaks.
func (a *Agent) protocols() version.Window { return a.cfg.Protocols.Or() }

func (a *Agent) aliveGossipAddrs() []string {
	out := []string{a.GossipAddr()}
	for _, m := range a.gossip.Members() {
		if m.Status == coordinator.StatusAlive && m.ID != a.id {
			out = append(out, m.Addr)
		}
	}
	return out
}
