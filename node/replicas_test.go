package node_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/node"
	tc "shoal/node/nodetest"
)

// holder returns the holder of mi's file on the node named name.
func holder(mi *api.ModelInfo, name string) *api.FileHolder {
	for i := range mi.Holders {
		if mi.Holders[i].NodeName == name {
			return &mi.Holders[i]
		}
	}
	return nil
}

// TestReplicaKeepsModelServable: a model loaded on server-0 with
// --replicas 2 is copied whole to server-1 (which has no memory for a
// shard), verified, and listed as held there; the copy survives server-1's
// restart. With server-0 crashed, the model is planned on server-2 (which
// has no disk for a copy, and says so), whose shard is fetched from
// server-1's copy, and serves. Unloading the model removes the copy.
func TestReplicaKeepsModelServable(t *testing.T) {
	path := writeModel(t)
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c := tc.NewWith(t, 3, func(i int, cfg *node.Config) {
		switch i {
		case 1:
			cfg.MemoryLimit = 1 << 20 // no shard: what it serves is its copy
		case 2:
			cfg.DiskLimit = 1 // no room for a copy
		}
	})
	waitHealthy(t, c, 0, 3, 3, 15*time.Second)
	drain := func(name string, on bool) {
		t.Helper()
		var err error
		tc.Eventually(t, 20*time.Second, "drain "+name, func() bool {
			err = c.Client(1, "").Drain(ctx(t), name, on)
			return err == nil
		})
	}
	// server-2 gets no shard until server-0 is dead, so the shard it gets
	// then can come only from a copy.
	drain("server-2", true)
	start := time.Now()
	if _, err := c.Client(0, "").LoadModel(ctx(t), api.LoadModelRequest{Path: path, Ctx: 256, Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	var mi *api.ModelInfo
	tc.Eventually(t, 30*time.Second, "the model ready with a copy on server-1", func() bool {
		mi = modelInfo(t, c, 1, "tiny")
		h := (*api.FileHolder)(nil)
		if mi != nil {
			h = holder(mi, "server-1")
		}
		return mi != nil && mi.Status == "ready" && h != nil && h.State == "ready" && mi.Copies == 2
	})
	t.Logf("load -> copy ready on server-1: %v", time.Since(start).Round(time.Millisecond))
	if len(mi.Shards) != 1 || mi.Shards[0].NodeName != "server-0" {
		t.Fatalf("shards before the crash: %+v", mi.Shards)
	}
	if mi.Replicas != 2 || len(mi.Holders) != 2 || !mi.Holders[0].Source || mi.Holders[0].NodeName != "server-0" {
		t.Fatalf("holders: %+v", mi.Holders)
	}
	replica := filepath.Join(c.Members[1].Cfg.DataDir, node.ReplicasDir, mi.Digest+".gguf")
	if got, err := os.ReadFile(replica); err != nil || !bytes.Equal(got, file) {
		t.Fatalf("server-1's copy: %v (%d bytes of %d)", err, len(got), len(file))
	}
	p, err := c.Client(0, "").Placement(ctx(t), "tiny")
	if err != nil || p.Replicas != 2 || len(p.Holders) != 2 {
		t.Fatalf("placement: %v %+v", err, p)
	}

	// The copy survives a restart.
	c.Stop(1, false)
	c.Restart(1)
	waitHealthy(t, c, 0, 3, 3, 30*time.Second)

	// server-0 dies; then server-2 takes shards again.
	third := c.Members[2].Agent.ID()
	killed := time.Now()
	c.Stop(0, false)
	tc.Eventually(t, 30*time.Second, "server-0 seen dead", func() bool {
		mi = modelInfo(t, c, 1, "tiny")
		return mi != nil && holder(mi, "server-0") != nil && holder(mi, "server-0").NodeStatus != "alive"
	})
	drain("server-2", false)
	var seen *api.ModelInfo // what server-2 said last, shown when the wait fails
	defer func() {
		if t.Failed() {
			b, _ := json.MarshalIndent(seen, "", "  ")
			t.Logf("the model as server-2 saw it last:\n%s", b)
		}
	}()
	tc.Eventually(t, 60*time.Second, "the model ready on server-2 alone", func() bool {
		mi = modelInfo(t, c, 2, "tiny")
		seen = mi
		if mi == nil || mi.Status != "ready" || len(mi.Shards) != 1 {
			return false
		}
		return mi.Shards[0].Node == third && mi.Shards[0].State == "ready"
	})
	t.Logf("kill -> ready on server-2: %v; shard %+v", time.Since(killed).Round(time.Millisecond), mi.Shards[0])
	if s := mi.Shards[0]; s.Source != "server-1" || s.Fetched == 0 {
		t.Errorf("server-2's shard came from %q (%d bytes fetched), not server-1's copy", s.Source, s.Fetched)
	}
	tc.Eventually(t, 20*time.Second, "server-2 listed as without room", func() bool {
		mi = modelInfo(t, c, 2, "tiny")
		h := (*api.FileHolder)(nil)
		if mi != nil {
			h = holder(mi, "server-2")
		}
		return h != nil && h.State == "no-room" && strings.Contains(h.Error, "free")
	})
	if _, err := os.Stat(filepath.Join(c.Members[2].Cfg.DataDir, node.ReplicasDir, mi.Digest+".gguf")); err == nil {
		t.Error("server-2 copied the file without the disk for it")
	}
	base := "http://" + c.Members[2].Agent.HTTPAddr()
	var code int
	var body string
	tc.Eventually(t, 30*time.Second, "a completion through server-2", func() bool {
		code, body = post(t, base+"/v1/completions", `{"model":"tiny","prompt":"hello","max_tokens":3}`)
		return code == 200 && strings.Contains(body, `"completion_tokens":3`)
	})

	// Unloading removes the copy.
	if err := c.Client(2, "").UnloadModel(ctx(t), "tiny"); err != nil {
		t.Fatal(err)
	}
	tc.Eventually(t, 20*time.Second, "server-1's copy removed", func() bool {
		_, err := os.Stat(replica)
		return os.IsNotExist(err)
	})
	if ents, _ := os.ReadDir(filepath.Dir(replica)); len(ents) != 0 {
		t.Errorf("left in server-1's %s: %v", node.ReplicasDir, fmt.Sprint(ents))
	}
}
