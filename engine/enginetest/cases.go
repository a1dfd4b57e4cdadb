package enginetest

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/quant"
	"shoal/engine/synth"
)

// Case is a model that a metamorphic test runs through several
// configurations (one node, pipeline stages, tensor- and expert-parallel
// groups) whose logits must agree.
type Case struct {
	Name   string
	Path   string
	Prompt []int32 // run as one chunk
	Decode []int32 // then one token a step
	Float  bool    // F32/F16/BF16 weights: the float tolerances apply
}

// The synthetic models of Cases. Their weights are larger than synth's
// default (std 0.08, not 0.02) so that the logits spread and a wrong
// result stands out of the tolerances.
var (
	// denseF32: 3 layers, GQA with 4 KV heads of 2 query heads, an FFN
	// of 11 blocks of 32.
	denseF32 = synth.Spec{Name: "synth-llama-f32", Arch: "llama", NEmbd: 128, NLayer: 3, NHead: 8, NHeadKV: 4,
		NFF: 352, Type: "f32", Seed: 19, Std: 0.08}
	// qwenQ8: Q8_0 weights, q/k/v biases and NeoX rope.
	qwenQ8 = synth.Spec{Name: "synth-qwen2-q8_0", Arch: "qwen2", NEmbd: 128, NLayer: 3, NHead: 4, NHeadKV: 2,
		NFF: 384, Type: "q8_0", Seed: 29, Std: 0.08}
	// moeQ8: a Mixtral-style MoE of 4 experts, 2 used a token.
	moeQ8 = synth.Spec{Name: "synth-moe-q8_0", Arch: "moe", NEmbd: 128, NLayer: 2, NHead: 8, NHeadKV: 4,
		NFF: 192, NExpert: 4, NExpertUsed: 2, Type: "q8_0", Seed: 23, Std: 0.08}
	// mqaQ8: multi-query attention, one KV head for 4 query heads: tensor
	// parallel splits the query heads and replicates the KV head.
	mqaQ8 = synth.Spec{Name: "synth-mqa-q8_0", Arch: "llama", NEmbd: 128, NLayer: 2, NHead: 4, NHeadKV: 1,
		NFF: 256, Type: "q8_0", Seed: 31, Std: 0.08}
)

// synthetic writes the synthetic models of Cases to a temporary folder.
func synthetic(t testing.TB) []Case {
	t.Helper()
	dir := t.TempDir()
	var cs []Case
	for i, s := range []synth.Spec{denseF32, qwenQ8, moeQ8, mqaQ8} {
		toks := Tokens(12, 512, uint64(i))
		cs = append(cs, Case{Name: s.Name, Path: Write(t, dir, s), Prompt: toks[:9], Decode: toks[9:], Float: s.Type == "f32"})
	}
	return cs
}

// Cases lists the synthetic models, then the oracle's when ../shared is
// there (its prompt, the last 3 tokens decoded one by one); it never
// skips.
func Cases(t testing.TB) []Case {
	t.Helper()
	cs := synthetic(t)
	oc := oracleCases(t)
	if oc == nil {
		t.Log("../shared/oracle absent: synthetic models only")
	}
	for _, c := range oc {
		f, err := gguf.Open(c.Model)
		if err != nil {
			t.Fatal(err)
		}
		float := IsFloat(f)
		f.Close()
		n := len(c.Tokens) - 3
		cs = append(cs, Case{Name: c.Name, Path: c.Model, Prompt: c.Tokens[:n], Decode: c.Tokens[n:], Float: float})
	}
	return cs
}

// Tokens returns n token ids in [1, nVocab) drawn from seed.
func Tokens(n, nVocab int, seed uint64) []int32 {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]int32, n)
	for i := range out {
		out[i] = 1 + rng.Int32N(int32(nVocab-1))
	}
	return out
}

// Perturb writes a copy of the model at path in which the rows of the
// named tensor are in reverse order, for a test to show that a changed
// weight changes its result.
func Perturb(t testing.TB, path, tensor string) string {
	t.Helper()
	raw, f := Parse(t, path)
	ti, ok := f.Tensor(tensor)
	if !ok {
		t.Fatalf("%s has no tensor %s", path, tensor)
	}
	data, rs := f.Data(ti), ti.RowSize()
	rows := make([][]byte, ti.Rows())
	for r := range rows {
		rows[r] = slices.Clone(data[r*rs : (r+1)*rs])
	}
	for r := range rows {
		copy(data[r*rs:], rows[len(rows)-1-r])
	}
	out := filepath.Join(t.TempDir(), "perturbed-"+filepath.Base(path))
	if err := os.WriteFile(out, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// Reference is what the configurations of a case are compared with: the
// logits of every prompt row, then of each decode token, from one runner
// holding the whole of m (sequence 1).
func Reference(t testing.TB, m *model.Model, c *Case) []float32 {
	t.Helper()
	return ReferenceKV(t, m, c, quant.F16)
}

// ReferenceKV is Reference with the KV cache in type kt.
func ReferenceKV(t testing.TB, m *model.Model, c *Case, kt quant.Type) []float32 {
	t.Helper()
	r, err := model.NewRunner(m, model.Options{Threads: 1, CacheTokens: 128, KVType: kt})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want, err := r.Prompt(1, c.Prompt, nil)
	for _, tok := range c.Decode {
		var l []float32
		if err == nil {
			l, err = r.Decode(1, tok)
		}
		want = append(want, l...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return want
}
