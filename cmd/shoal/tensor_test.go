package main

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"shoal/engine/enginetest"
	tc "shoal/node/nodetest"
)

// TestTensorPlanOfOneKVHead loads a model with one KV head (multi-query
// attention) into three agents, none of which can hold it with another,
// with --strategy tensor: the plan splits its 4 query heads over the three
// (each replicating the KV head, as vLLM does), where the planner used to
// refuse it; logits through the cluster equal the single node's within
// the oracle tolerances.
func TestTensorPlanOfOneKVHead(t *testing.T) {
	dir := t.TempDir()
	path := genLlama(t, filepath.Join(dir, "mqa.gguf"), 12, 1)
	const limit = 4400 << 10 // the model is 8.4 MB: two agents cannot hold it
	c := threeAgents(t, limit)
	flags := []string{"--addr", c.Members[0].Agent.HTTPAddr(), "--token", tc.Secret}
	out, err := execute(t, "", append([]string{"model", "load", path, "--name", "mqa", "--ctx", "64", "--overhead", "256KiB",
		"--strategy", "tensor", "--wait", "60s"}, flags...)...)
	if err != nil || !strings.Contains(out, "is ready") {
		t.Fatalf("load: %q %v", out, err)
	}
	p, err := c.Client(1, tc.Secret).Placement(t.Context(), "mqa")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Stages) != 1 || len(p.Stages[0].Members) != 3 {
		t.Fatalf("plan: %s, %d stages, want one tensor-parallel stage of 3 members", p.Strategy, len(p.Stages))
	}
	for _, m := range p.Stages[0].Members {
		t.Logf("member %s heads [%d,%d) KV %d bytes", m.Node, m.HeadLo, m.HeadHi, m.KVBytes)
	}
	tokens := "1,17,42,99,7,250,3,64"
	local, remote := filepath.Join(dir, "local.f32"), filepath.Join(dir, "cluster.f32")
	if _, err := execute(t, "", "logits", "--model", path, "--tokens", tokens, "--out", local); err != nil {
		t.Fatal(err)
	}
	if _, err := execute(t, "", "logits", "--cluster", c.Members[2].Agent.HTTPAddr(), "--token", tc.Secret,
		"--model", "mqa", "--tokens", tokens, "--out", remote); err != nil {
		t.Fatal(err)
	}
	want, got := readF32(t, local), readF32(t, remote)
	m := enginetest.Compare(want, got, 2048)
	t.Logf("cluster vs single node: %s", m)
	if err := m.Check(false); err != nil {
		t.Fatal(err)
	}
}

func readF32(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// TestTensorPlansOfOracleModels loads the oracle's MoE model (and a dense
// quantized one) into three agents with --strategy tensor --nodes (all
// three) and compares
// `shoal logits --cluster` with the single node's on the oracle's prompt.
// The MoE model used to plan and then fail every step ("routed expert 0 is
// held by 2 tensor-parallel members": a member holding no expert lost its
// empty list on the way through the Raft log).
func TestTensorPlansOfOracleModels(t *testing.T) {
	want := map[string]bool{"moe-q4_0": true, "llama-q8_0": true}
	var cases []enginetest.OracleCase
	for _, oc := range enginetest.OracleCases(t) {
		if want[oc.Name] {
			cases = append(cases, oc)
		}
	}
	if len(cases) == 0 {
		t.Skip("the oracle has neither moe-q4_0 nor llama-q8_0")
	}
	dir := t.TempDir()
	c := threeAgents(t, 0)
	// Every agent in one tensor-parallel group: with 2 experts (the MoE
	// case), one member holds none.
	var names []string
	for _, m := range c.Members {
		names = append(names, m.Cfg.Name)
	}
	nodes := strings.Join(names, ",")
	_, err := execute(t, "", "model", "load", cases[0].Model, "--nodes", names[0]+",nope", "--addr", c.Members[0].Agent.HTTPAddr(), "--token", tc.Secret)
	if err == nil || !strings.Contains(err.Error(), `node "nope" is not in the cluster`) {
		t.Fatalf("--nodes with an unknown node: %v", err)
	}
	for _, oc := range cases {
		t.Run(oc.Name, func(t *testing.T) {
			out, err := execute(t, "", "model", "load", oc.Model, "--name", oc.Name, "--ctx", "128", "--overhead", "1MiB",
				"--strategy", "tensor", "--nodes", nodes, "--wait", "90s", "--addr", c.Members[0].Agent.HTTPAddr(), "--token", tc.Secret)
			if err != nil || !strings.Contains(out, "is ready") {
				t.Fatalf("load: %q %v", out, err)
			}
			p, err := c.Client(1, tc.Secret).Placement(t.Context(), oc.Name)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Stages) != 1 || len(p.Stages[0].Members) != 3 {
				t.Fatalf("plan: %s with %d stages, want one tensor-parallel stage of 3 members", p.Strategy, len(p.Stages))
			}
			for _, m := range p.Stages[0].Members {
				t.Logf("member %s heads [%d,%d) FFN [%d,%d) experts %v", m.Node, m.HeadLo, m.HeadHi, m.FFNLo, m.FFNHi, m.Experts)
			}
			var ids []string
			for _, tok := range oc.Tokens {
				ids = append(ids, strconv.Itoa(int(tok)))
			}
			tokens := strings.Join(ids, ",")
			local, remote := filepath.Join(dir, oc.Name+"-local.f32"), filepath.Join(dir, oc.Name+"-cluster.f32")
			if _, err := execute(t, "", "logits", "--model", oc.Model, "--tokens", tokens, "--out", local); err != nil {
				t.Fatal(err)
			}
			if _, err := execute(t, "", "logits", "--cluster", c.Members[2].Agent.HTTPAddr(), "--token", tc.Secret,
				"--model", oc.Name, "--tokens", tokens, "--out", remote); err != nil {
				t.Fatal(err)
			}
			m := enginetest.Compare(readF32(t, local), readF32(t, remote), oc.NVocab)
			t.Logf("%s, tensor over %d members: cluster vs single node %s", oc.Name, len(p.Stages[0].Members), m)
			if err := m.Check(false); err != nil {
				t.Fatal(err)
			}
		})
	}
}
