package node_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"shoal/api"
	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/node"
	"shoal/node/fingerprint"
	tc "shoal/node/nodetest"
	"shoal/placement"
)

// TestVulkanMembers runs the oracle's models through agents: one with
// --device vulkan (lavapipe in CI) and two on the CPU. A 2-member
// tensor-parallel group and a 2-stage pipeline, each of the Vulkan agent
// and a CPU agent, give logits within the oracle's tolerances; the Vulkan
// agent gossips its GPU, and its members say how many layers the GPU runs.
func TestVulkanMembers(t *testing.T) {
	enginetest.VulkanOrSkip(t)
	cases := enginetest.OracleCases(t)
	// The nodes' speeds are set, not measured (lavapipe's own rate would
	// leave the GPU nothing): the GPU 16x the CPU's bandwidth, about what an
	// RTX 3090 is to a desktop CPU. In a tensor group the GPU member is rank
	// 0 and also holds the embedding and the output, which outweigh the
	// layers of these small models; as fast as the CPU (or 4x) the planner
	// gave it none of the heads.
	c := tc.NewWith(t, 3, func(i int, cfg *node.Config) {
		cfg.Device = "cpu"
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := fingerprint.Record(cfg.DataDir, "test", 10, 1); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			cfg.Device, cfg.Tuning.GPUGBps = "vulkan", 16
		}
	})
	cl := c.Client(0, "")
	gpuNode := c.Members[0].Cfg.Name
	tc.Eventually(t, 30*time.Second, "the GPU gossiped", func() bool {
		nodes, err := cl.Nodes(ctx(t))
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.Name == gpuNode {
				return n.Caps.GPU != "" && n.Caps.GPUGBps > 0 && n.Caps.GPUMem > 0
			}
		}
		return false
	})
	names := []string{gpuNode, c.Members[1].Cfg.Name}
	for _, oc := range cases {
		for _, strategy := range []string{"tensor", "pipeline"} {
			t.Run(oc.Name+"/"+strategy, func(t *testing.T) {
				if strategy == "tensor" && headUnits(t, oc.Model) < 2 {
					// its rows are one K-quant super-block: a head slice
					// would cut blocks (the engine-level groups cover it)
					t.Skipf("%s: the heads cannot be split in two", oc.Name)
				}
				name := strings.ReplaceAll(oc.Name, "_", "-") + "-" + strategy[:2]
				if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Path: oc.Model, Name: name, Nodes: names, Strategy: strategy, Ctx: 128, Wire: "f32"}); err != nil {
					t.Fatal(err)
				}
				waitModelReady(t, c, name)
				pl, err := cl.Placement(ctx(t), name)
				if err != nil {
					t.Fatal(err)
				}
				gpuLayers := -1
				for _, st := range pl.Stages {
					for _, m := range st.Members {
						t.Logf("%s: layers [%d,%d) heads [%d,%d) ffn [%d,%d) experts %v, %d layers on a GPU", m.NodeName, st.Lo, st.Hi, m.HeadLo, m.HeadHi, m.FFNLo, m.FFNHi, m.Experts, m.GPULayers)
						if m.NodeName == gpuNode {
							gpuLayers = m.GPULayers
						}
						// Both members do part of the work: in a tensor
						// group each holds heads, FFN columns or experts.
						if strategy == "tensor" && (len(pl.Stages) != 1 || len(st.Members) != 2 || m.HeadHi <= m.HeadLo && m.FFNHi <= m.FFNLo && len(m.Experts) == 0) {
							t.Errorf("not a 2-member tensor group where each member holds part of each layer: %s", m.NodeName)
						}
					}
					if strategy == "pipeline" && len(pl.Stages) != 2 {
						t.Errorf("%d pipeline stages, want 2", len(pl.Stages))
					}
				}
				if gpuLayers <= 0 {
					t.Errorf("the Vulkan agent's member runs %d layers on its GPU: %+v", gpuLayers, pl.Stages)
				}
				// the model list (the dashboard's plan line) says it too
				for _, sh := range modelInfo(t, c, 0, name).Shards {
					if (sh.NodeName == gpuNode) != (sh.GPULayers > 0) {
						t.Errorf("model list: %s runs %d layers on a GPU", sh.NodeName, sh.GPULayers)
					}
				}
				var l *api.Logits
				tc.Eventually(t, 30*time.Second, name+" serving", func() bool {
					l, err = cl.ClusterLogits(ctx(t), name, oc.Tokens)
					return err == nil
				})
				mt := enginetest.Compare(oc.Logits, l.Data, oc.NVocab)
				t.Logf("ORACLE agents %s vulkan+cpu %-14s %s (%d layers on the GPU)", strategy, oc.Name, mt, gpuLayers)
				if err := mt.Check(strings.HasSuffix(oc.Name, "f16") || strings.HasSuffix(oc.Name, "f32")); err != nil {
					t.Error(err)
				}
				if err := cl.UnloadModel(ctx(t), name); err != nil {
					t.Fatal(fmt.Errorf("unload %s: %w", name, err))
				}
			})
		}
	}
}

// headUnits is how many slices the planner can cut the heads of the model
// at path into.
func headUnits(t *testing.T, path string) int {
	prof := profileOf(t, path)
	return prof.HeadUnits()
}

// profileOf is the planner's profile of the model at path.
func profileOf(t *testing.T, path string) placement.ModelProfile {
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prof, err := placement.ProfileFromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return prof
}
