package synth_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/gguf"
	"shoal/engine/model"
	"shoal/engine/quant"
	"shoal/engine/synth"
)

// dequantizedCopy returns the GGUF image img with every tensor converted to
// F32 (the same weights, as the quantized file decodes them).
func dequantizedCopy(t *testing.T, img []byte) []byte {
	t.Helper()
	f, err := gguf.Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	w := gguf.NewWriter(&out)
	for _, kv := range f.KVs {
		if kv.Key == "general.alignment" {
			continue
		}
		if err := w.AddKV(kv.Key, kv.Value); err != nil {
			t.Fatal(err)
		}
	}
	for _, ti := range f.Tensors {
		if err := w.AddTensor(ti.Name, quant.F32, ti.Dims...); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteHeader(); err != nil {
		t.Fatal(err)
	}
	for _, ti := range f.Tensors {
		data, cols, rows, rs := f.Data(&ti), ti.Dim(0), ti.Rows(), ti.RowSize()
		fl := make([]float32, cols)
		raw := make([]byte, 0, 4*cols*rows)
		for r := 0; r < rows; r++ {
			quant.DequantizeRow(ti.Type, data[r*rs:(r+1)*rs], fl)
			row := make([]byte, 4*cols)
			quant.QuantizeRow(quant.F32, fl, row)
			raw = append(raw, row...)
		}
		if err := w.WriteTensor(ti.Name, raw); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func argmax(l []float32) (best int, margin float32) {
	second := -1
	for i := range l {
		if l[i] > l[best] {
			best, second = i, best
		} else if i != best && (second < 0 || l[i] > l[second]) {
			second = i
		}
	}
	return best, l[best] - l[second]
}

// A model whose matrices are IQ4_XS (or IQ4_NL) generates what the same
// model dequantized to F32 generates: the float model decodes 24 tokens
// greedily, the quantized one is fed the same tokens, and at every step
// picks the same next token, but for at most 2 near-ties (the float model's
// two best within 0.2, which the quantized activations may break either
// way); its logits stay within enginetest's bounds for quantized models.
// (Measured: IQ4_XS nrmse 3.8e-2, IQ4_NL 2.8e-2, no near-tie flipped; a
// Q4_K model of the same shape, as a control, 3.8e-2 with two flips of
// margin < 0.06, and Q8_0 2.7e-2: the differences are mostly those of the
// quantized activations.)
func TestIQ4ModelMatchesDequantized(t *testing.T) {
	for _, typ := range []string{"iq4_xs", "iq4_nl"} {
		t.Run(typ, func(t *testing.T) { modelMatchesDequantized(t, typ) })
	}
}

// modelMatchesDequantized runs the check above for a model of weight type
// typ.
func modelMatchesDequantized(t *testing.T, typ string) {
	s := synth.Spec{Arch: "llama", NEmbd: 256, NLayer: 2, NHead: 4, NHeadKV: 2, NFF: 512, Type: typ, Seed: 7, Std: 0.08}
	img := enginetest.Image(t, s)
	f, err := gguf.Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := quant.ParseType(typ)
	for _, name := range []string{"blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"} {
		if ti, ok := f.Tensor(name); !ok || ti.Type != want {
			t.Fatalf("%s is %v, want %v", name, ti.Type, want)
		}
	}
	dir := t.TempDir()
	qp, fp := filepath.Join(dir, "q.gguf"), filepath.Join(dir, "f32.gguf")
	if err := os.WriteFile(qp, img, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fp, dequantizedCopy(t, img), 0o644); err != nil {
		t.Fatal(err)
	}
	qm, fm := enginetest.OpenPath(t, qp), enginetest.OpenPath(t, fp)
	runner := func(m *model.Model) *model.Runner {
		r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 64})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	qr, fr := runner(qm), runner(fm)
	prompt := enginetest.Tokens(8, qm.NVocab, 3)
	ql, err := qr.Prompt(1, prompt, []int{len(prompt) - 1})
	if err != nil {
		t.Fatal(err)
	}
	fl, err := fr.Prompt(1, prompt, []int{len(prompt) - 1})
	if err != nil {
		t.Fatal(err)
	}
	var qAll, fAll []float32
	var gen []int
	ties := 0
	for step := 0; step < 24; step++ {
		qAll, fAll = append(qAll, ql...), append(fAll, fl...)
		ft, margin := argmax(fl)
		qt, _ := argmax(ql)
		if qt != ft {
			if margin >= 0.2 || ties == 2 {
				t.Fatalf("step %d: quantized model picks %d, float model %d (margin %.3f); so far %v", step, qt, ft, margin, gen)
			}
			ties++
		}
		gen = append(gen, ft)
		if ql, err = qr.Decode(1, int32(ft)); err != nil {
			t.Fatal(err)
		}
		ql = append([]float32(nil), ql...)
		if fl, err = fr.Decode(1, int32(ft)); err != nil {
			t.Fatal(err)
		}
	}
	m := enginetest.Compare(fAll, qAll, qm.NVocab)
	t.Logf("%s: tokens %v, %d near-ties; logits vs F32: %v", typ, gen, ties, m)
	if err := m.Check(false); err != nil {
		t.Error(err)
	}
}
