package model_test

import (
	"math"
	"testing"
	"unsafe"

	"shoal/engine/enginetest"
	"shoal/engine/kernels"
	"shoal/engine/model"
	"shoal/engine/synth"
)

// A model opened from a file has its Q4_0/Q8_0 layer matrices packed where
// the kernels read the packed layout and every other layer matrix copied out
// of the file's pages (kernels.Resident), and gives the logits of the same
// model parsed from memory (never packed or copied), prompt and decode.
func TestOpenPacksMatrices(t *testing.T) {
	for _, typ := range []string{"q8_0", "q4_0", "q4_k", "f16"} {
		t.Run(typ, func(t *testing.T) {
			spec := synth.Spec{Arch: "llama", NLayer: 2, NEmbd: 128, NHead: 4, NHeadKV: 2, NFF: 256,
				Type: typ, OutputType: "q8_0", Seed: 5, Std: 0.08}
			fromFile, inMemory := openTwice(t, spec)
			ly, lm := fromFile.W.Layers[1], inMemory.W.Layers[1]
			for name, mm := range map[string][2]*kernels.Matrix{"wq": {ly.Wq, lm.Wq}, "wk": {ly.Wk, lm.Wk}, "wv": {ly.Wv, lm.Wv}, "wo": {ly.Wo, lm.Wo},
				"gate": {ly.Gate, lm.Gate}, "up": {ly.Up, lm.Up}, "down": {ly.Down, lm.Down}, "output": {fromFile.W.Output, inMemory.W.Output}} {
				m := mm[0]
				wantPacked := kernels.Pack(mm[1]).Packed // the active kernels read the packed layout
				if m.Packed != wantPacked {
					t.Errorf("%s (%s): packed %v, want %v (kernels %s)", name, m.Type, m.Packed, wantPacked, kernels.Path())
				}
				tname := map[string]string{"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}[name]
				if tname == "" {
					tname = "output"
				} else {
					tname = "blk.1." + tname
				}
				ti, ok := fromFile.File.Tensor(tname + ".weight")
				if !ok {
					t.Fatalf("no tensor %s", tname)
				}
				if &m.Data[0] == &fromFile.File.Data(ti)[0] {
					t.Errorf("%s (%s) reads the file's pages, want a resident copy", name, m.Type)
				}
			}
			if fromFile.W.TokEmbd.Packed || inMemory.W.Layers[1].Wq.Packed {
				t.Errorf("the embedding or a matrix of the in-memory model is packed")
			}
			sameLogits(t, fromFile, inMemory)
		})
	}
}

// A MoE model opened from a file gives each routed expert resident copies
// of its matrices, out of the file's pages, and gives the logits of the
// same model parsed from memory.
func TestOpenCopiesExperts(t *testing.T) {
	for _, typ := range []string{"q4_0", "q4_k"} {
		t.Run(typ, func(t *testing.T) {
			spec := synth.Spec{Arch: "moe", NLayer: 2, NEmbd: 128, NHead: 4, NHeadKV: 2, NFF: 96, NExpert: 4, NExpertUsed: 2,
				Type: typ, OutputType: "q8_0", Seed: 6, Std: 0.08}
			fromFile, inMemory := openTwice(t, spec)
			inFile := func(name string, b []byte) bool {
				ti, ok := fromFile.File.Tensor(name)
				if !ok {
					t.Fatalf("no tensor %s", name)
				}
				d := fromFile.File.Data(ti)
				lo, hi := uintptr(unsafe.Pointer(&d[0])), uintptr(unsafe.Pointer(&d[len(d)-1]))
				p := uintptr(unsafe.Pointer(&b[0]))
				return p >= lo && p <= hi
			}
			ly := fromFile.W.Layers[1]
			if len(ly.Experts) != 4 {
				t.Fatalf("%d experts, want 4", len(ly.Experts))
			}
			for x, e := range ly.Experts {
				for name, m := range map[string]*kernels.Matrix{"ffn_gate_exps": e.Gate, "ffn_up_exps": e.Up, "ffn_down_exps": e.Down} {
					if inFile("blk.1."+name+".weight", m.Data) {
						t.Errorf("expert %d %s (%s) reads the file's pages, want a resident copy", x, name, m.Type)
					}
				}
				if want := inMemory.W.Layers[1].Experts[x].Gate; e.Gate.Rows != want.Rows || e.Down.Rows != inMemory.W.Layers[1].Experts[x].Down.Rows {
					t.Errorf("expert %d: %d gate rows, %d down rows", x, e.Gate.Rows, e.Down.Rows)
				}
			}
			sameLogits(t, fromFile, inMemory)
		})
	}
}

// openTwice writes the model of spec to a file and opens it (weights packed
// or copied), and loads the same bytes parsed from memory (neither).
func openTwice(t *testing.T, spec synth.Spec) (fromFile, inMemory *model.Model) {
	t.Helper()
	path := enginetest.Write(t, "", spec)
	fromFile = enginetest.OpenPath(t, path)
	_, f := enginetest.Parse(t, path)
	var err error
	if inMemory, err = model.Load(f); err != nil {
		t.Fatal(err)
	}
	return fromFile, inMemory
}

// sameLogits asserts that the two models give the same logits for a prompt
// and the tokens decoded after it.
func sameLogits(t *testing.T, fromFile, inMemory *model.Model) {
	t.Helper()
	tokens := []int32{3, 70, 250, 9, 1, 400, 77, 12}
	logits := func(m *model.Model) []float32 {
		r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 32})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		out, err := r.Prompt(0, tokens[:5], nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range tokens[5:] {
			l, err := r.Decode(0, tk)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, l...)
		}
		return out
	}
	got, want := logits(fromFile), logits(inMemory)
	if len(got) != len(want) {
		t.Fatalf("%d logits, want %d", len(got), len(want))
	}
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > 1e-4*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("logit %d: model from the file %g, in memory %g", i, got[i], want[i])
		}
	}
}
