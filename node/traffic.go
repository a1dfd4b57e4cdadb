package node

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/api/dashboard"
	"shoal/coordinator"
)

// peerTraffic asks every other live agent of the state for its traffic
// (dashboard.Peers): the dashboard's cluster view sums what each answered
// and names those that did not.
func (a *Agent) peerTraffic(ctx context.Context) (got []dashboard.NodeTraffic, missing []string) {
	type peer struct{ id, name string }
	var peers []peer
	a.viewState(func(st *coordinator.State) {
		for _, n := range st.SortedNodes() {
			if n.ID != a.id && n.Status == coordinator.StatusAlive && n.RPCAddr != "" {
				peers = append(peers, peer{n.ID, n.Name})
			}
		}
	})
	if a.fwd == nil {
		for _, p := range peers {
			missing = append(missing, p.name)
		}
		return nil, missing
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			b, err := a.fwd.FetchPeer(ctx, p.id, "/dashboard/api/traffic")
			var nt dashboard.NodeTraffic
			if err == nil {
				err = json.Unmarshal(b, &nt)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				a.log.Debug("a peer's traffic", zap.String("peer", p.name), zap.Error(err))
				missing = append(missing, p.name)
				return
			}
			nt.Node = p.name // the name the state certifies, not the one it says
			got = append(got, nt)
		})
	}
	wg.Wait()
	return got, missing
}
