package node_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"shoal/node"
	"shoal/node/nodetest"
)

// TestCapacityRemeasured: a node that measured itself while the host was
// busy (0.001 GFLOPS and GB/s, cached in its data dir) measures again in
// the background and gossips the medians once they move: the cluster's
// state, which the planner reads, shows the new figures without a
// restart.
func TestCapacityRemeasured(t *testing.T) {
	c := nodetest.NewWith(t, 1, func(i int, cfg *node.Config) {
		cfg.Tuning.Remeasure = node.Duration(300 * time.Millisecond)
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		busy, _ := json.Marshal(map[string]any{"method": "kernels-q8_0-n8,decode-stream", "cores": runtime.NumCPU(), "gflops": 0.001, "mem_gbps": 0.001,
			"samples": []map[string]any{{"gflops": 0.001, "mem_gbps": 0.001}}})
		if err := os.WriteFile(filepath.Join(cfg.DataDir, "capabilities.json"), busy, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	cl := c.Client(0, nodetest.Secret)
	var gflops, gbps float64
	nodetest.Eventually(t, 30*time.Second, "the re-measured capacity in the cluster's state", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		nodes, err := cl.Nodes(ctx)
		if err != nil || len(nodes) != 1 {
			return false
		}
		gflops, gbps = nodes[0].Caps.GFLOPS, nodes[0].Caps.MemGBps
		return gflops > 0.01 && gbps > 0.01
	})
	t.Logf("registered at 0.001 GFLOPS and 0.001 GB/s, now %.3g GFLOPS and %.3g GB/s", gflops, gbps)
}
