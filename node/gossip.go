package node

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
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
	// Then: keep the alive peers on disk, and join failed members again
	// (rejoin.go).
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var rj rejoiner
	var joining atomic.Bool
	var written string
	for {
		members := a.gossip.Members()
		var addrs []string
		for _, m := range members {
			if m.Status == coordinator.StatusAlive && m.ID != a.id {
				addrs = append(addrs, m.Addr)
			}
		}
		if b, _ := json.Marshal(addrs); len(addrs) > 0 && string(b) != written {
			_ = os.WriteFile(peersFile, b, 0o600)
			written = string(b)
		}
		if again := rj.due(time.Now(), a.id, members, a.isRevoked); len(again) > 0 && joining.CompareAndSwap(false, true) {
			// Off the loop: a join waits for each address that does not
			// answer (memberlist's TCP timeout).
			go func() {
				defer joining.Store(false)
				if n, err := a.ml.Join(again); n > 0 {
					a.log.Info("joined failed members again", zap.Strings("addrs", again), zap.Int("contacted", n))
				} else {
					a.log.Debug("failed members not reachable yet", zap.Strings("addrs", again), zap.Error(err))
				}
			}()
		}
		select {
		case <-a.done:
			return
		case <-t.C:
		}
	}
}
