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
	"shoal/engine/model"
	"shoal/node"
	"shoal/node/fingerprint"
	tc "shoal/node/nodetest"
)

// TestArchPlans runs the newer architectures' oracle cases
// (enginetest.ArchCases: llama.cpp 0.7.0's logits) through three agents: a
// tensor-parallel group of the three (two where the heads cut in two only),
// where each member holds part of each layer (a sliding-window layer's
// heads split like any other), and a pipeline of three stages. The cluster's logits are within the oracle's
// tolerances.
func TestArchPlans(t *testing.T) {
	cases := enginetest.ArchCases(t)
	c, names := equalNodes(t, 3)
	cl := c.Client(0, "")
	for _, oc := range cases {
		for _, strategy := range []string{"tensor", "pipeline", "experts"} {
			t.Run(oc.Name+"/"+strategy, func(t *testing.T) {
				name := strings.ReplaceAll(oc.Name, "_", "-") + "-" + strategy[:2]
				prof := profileOf(t, oc.Model)
				// as many members as the heads can be cut for, as many
				// stages as there are layers; a MoE model's experts over
				// a tensor-parallel group of all three
				nodes := names[:min(len(names), prof.NLayer)]
				load := strategy
				switch strategy {
				case "tensor":
					nodes = names[:min(len(names), prof.HeadUnits())]
				case "experts":
					if prof.NExpert < 2*len(names) {
						t.Skipf("%d routed experts (fewer than two per member)", prof.NExpert)
					}
					nodes, load = names, "tensor"
				}
				if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Path: oc.Model, Name: name, Nodes: nodes, Strategy: load, Ctx: 128, Wire: "f32"}); err != nil {
					t.Fatal(err)
				}
				waitModelReady(t, c, name)
				pl, err := cl.Placement(ctx(t), name)
				if err != nil {
					t.Fatal(err)
				}
				expertHolders := 0
				for _, st := range pl.Stages {
					for _, m := range st.Members {
						t.Logf("%s: layers [%d,%d) heads [%d,%d) ffn [%d,%d) experts %v", m.NodeName, st.Lo, st.Hi, m.HeadLo, m.HeadHi, m.FFNLo, m.FFNHi, m.Experts)
						if strategy == "tensor" && m.HeadHi <= m.HeadLo && m.FFNHi <= m.FFNLo {
							t.Errorf("%s holds nothing of each layer", m.NodeName)
						}
						if strategy == "experts" && len(m.Experts) == prof.NExpert {
							t.Errorf("%s holds every expert: want a part of them", m.NodeName)
						}
						if strategy == "experts" && len(m.Experts) > 0 {
							expertHolders++
						}
					}
				}
				// (the planner may give a member heads and no experts)
				if strategy == "experts" && expertHolders < 2 {
					t.Errorf("the experts are held by %d members, want them split over at least two", expertHolders)
				}
				if c := configOf(t, oc.Model); c.MLA != nil {
					// the latent and the rotated key, once per token and layer, in F16
					if want := uint64((c.MLA.KVLora + c.RopeDim) * c.NLayer * 2); pl.KVBytesPerToken != want {
						t.Errorf("placement shows %d KV bytes per token, want (%d + %d) x %d layers x 2 = %d", pl.KVBytesPerToken, c.MLA.KVLora, c.RopeDim, c.NLayer, want)
					}
				}
				if strategy != "pipeline" && (len(pl.Stages) != 1 || len(pl.Stages[0].Members) != len(nodes) || len(nodes) < 2) {
					t.Errorf("want one tensor-parallel stage of %d members: %+v", len(nodes), pl.Stages)
				}
				if strategy == "pipeline" && len(pl.Stages) != len(nodes) {
					t.Errorf("%d pipeline stages, want %d", len(pl.Stages), len(nodes))
				}
				var l *api.Logits
				tc.Eventually(t, 30*time.Second, name+" serving", func() bool {
					l, err = cl.ClusterLogits(ctx(t), name, oc.Tokens)
					return err == nil
				})
				mt := enginetest.Compare(oc.Logits, l.Data, oc.NVocab)
				t.Logf("ORACLE agents %s %-14s %s", strategy, oc.Name, mt)
				if err := oc.Check(mt, strings.HasSuffix(oc.Name, "f16")); err != nil {
					t.Error(err)
				}
				if err := cl.UnloadModel(ctx(t), name); err != nil {
					t.Fatal(fmt.Errorf("unload %s: %w", name, err))
				}
			})
		}
	}
	// A quantized KV cache through a tensor-parallel group of three: the
	// plan and placement say so and count its bytes, and the logits are
	// llama.cpp's with a Q8_0 cache within the quantized tolerances. A
	// model whose heads are not a multiple of 32 values is refused with
	// the reason.
	t.Run("kv-q8_0", func(t *testing.T) {
		oc := enginetest.ArchCase(t, "llama-q8_0")
		theirs, ok, err := oc.More("kv-q8_0-fa.f32")
		if err != nil || !ok {
			t.Fatalf("no Q8_0-cache logits: %v", err)
		}
		if _, err := cl.LoadModel(ctx(t), api.LoadModelRequest{Path: oc.Model, Name: "kvq8", Nodes: names, Strategy: "tensor", Ctx: 128, Wire: "f32", KVType: "q8_0"}); err != nil {
			t.Fatal(err)
		}
		waitModelReady(t, c, "kvq8")
		pl, err := cl.Placement(ctx(t), "kvq8")
		if err != nil {
			t.Fatal(err)
		}
		// 4 layers x K and V x 4 KV heads of 32 values in Q8_0 blocks
		if want := uint64(4 * 2 * 4 * 34); pl.KVType != "q8_0" || pl.KVBytesPerToken != want {
			t.Errorf("placement: %s cache of %d bytes per token, want q8_0 of %d", pl.KVType, pl.KVBytesPerToken, want)
		}
		var l *api.Logits
		tc.Eventually(t, 30*time.Second, "kvq8 serving", func() bool {
			l, err = cl.ClusterLogits(ctx(t), "kvq8", oc.Tokens)
			return err == nil
		})
		mt := enginetest.Compare(theirs, l.Data, oc.NVocab)
		t.Logf("ORACLE agents tensor q8_0 cache vs llama.cpp's: %s", mt)
		if err := mt.Check(false); err != nil {
			t.Error(err)
		}
		gemma := enginetest.ArchCase(t, "gemma3-f16") // heads of 48
		_, err = cl.LoadModel(ctx(t), api.LoadModelRequest{Path: gemma.Model, Name: "kvbad", Nodes: names[:1], KVType: "q4_0"})
		if err == nil || !strings.Contains(err.Error(), "divisible by 32") {
			t.Errorf("a Q4_0 cache for heads of 48: %v", err)
		}
	})
}

func configOf(t *testing.T, path string) model.Config {
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := model.ConfigFromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// equalNodes starts n agents that record the same measured capacity (10
// GFLOPS, 1 GB/s) instead of measuring their own, so a plan over them does
// not depend on a busy host, and waits until each is listed; it returns
// the cluster and the nodes' names.
func equalNodes(t *testing.T, n int) (*tc.Cluster, []string) {
	t.Helper()
	return fingerprinted(t, n, nil)
}

// fingerprinted is a cluster of n agents whose fingerprints say the same,
// each configured by more (when set).
func fingerprinted(t *testing.T, n int, more func(i int, cfg *node.Config)) (*tc.Cluster, []string) {
	t.Helper()
	c := tc.NewWith(t, n, func(i int, cfg *node.Config) {
		if more != nil {
			more(i, cfg)
		}
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := fingerprint.Record(cfg.DataDir, "test", 10, 1); err != nil {
			t.Fatal(err)
		}
	})
	var names []string
	for _, m := range c.Members {
		names = append(names, m.Cfg.Name)
	}
	cl := c.Client(0, "")
	tc.Eventually(t, 30*time.Second, fmt.Sprintf("%d nodes listed", n), func() bool {
		nodes, err := cl.Nodes(ctx(t))
		return err == nil && len(nodes) == n
	})
	return c, names
}
