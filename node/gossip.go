package node

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/node/config"
	"shoal/transport"
)

// Gossip membership is node/membership's: this file joins it.

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
			addr, _ := config.JoinAddr(j)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var got []string
			if err := transport.Call(ctx, a.ep, addr, transport.KindRPC, methodSeeds, nil, &got); err == nil {
				seeds = append(seeds, got...)
			} else if errors.Is(err, transport.ErrRevoked) {
				cancel()
				a.log.Error("the cluster refuses this node: it was removed with 'shoal node rm'; stopping", zap.String("addr", addr), zap.Error(err))
				go a.close(false) // waits for this loop to return
				return
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
	a.life.joined.Store(true)
	a.checkReady()
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
