package model_test

import (
	"strings"
	"testing"

	"shoal/engine/device"
	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/quant"
)

// TestOracle runs every case of ../shared/oracle and compares the logits of
// every position with llama.cpp's by the tolerances its README suggests.
func TestOracle(t *testing.T) {
	for _, c := range enginetest.OracleCases(t) {
		t.Run(c.Name, func(t *testing.T) { oracleOn(t, c, nil) })
	}
}

// TestOracleArchs runs the cases of the newer architectures
// (enginetest.ArchCases: llama.cpp 0.7.0's logits) on the CPU.
func TestOracleArchs(t *testing.T) {
	for _, c := range enginetest.ArchCases(t) {
		t.Run(c.Name, func(t *testing.T) { oracleOn(t, c, nil) })
	}
}

// TestKVCacheTypes runs the cases that keep llama.cpp's logits with its K
// and V cache in F16, Q8_0 and Q4_0 (flash attention on, which llama.cpp
// needs for a quantized V) with the same cache types: with a quantized
// cache the engine's logits are closer to llama.cpp's with that cache than
// llama.cpp's own are to its F16 cache's, by a margin.
func TestKVCacheTypes(t *testing.T) {
	n := 0
	for _, c := range enginetest.ArchCases(t) {
		ref, ok, err := c.More("kv-f16-fa.f32")
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue
		}
		n++
		m := enginetest.OpenPath(t, c.Model)
		for _, kt := range []quant.Type{quant.Q8_0, quant.Q4_0} {
			theirs, ok, err := c.More("kv-" + strings.ToLower(kt.String()) + "-fa.f32")
			if err != nil || !ok {
				t.Fatalf("%s: no %s logits: %v", c.Name, kt, err)
			}
			r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 128, KVType: kt})
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.Prompt(0, c.Tokens, nil)
			r.Close()
			if err != nil {
				t.Fatal(err)
			}
			ours, own := enginetest.Compare(theirs, got, c.NVocab), enginetest.Compare(ref, theirs, c.NVocab)
			t.Logf("%-20s %s cache: vs llama.cpp's with it %s; llama.cpp's own F16 vs %s: %s", c.Name, kt, ours, kt, own)
			if ours.NRMSE > own.NRMSE || ours.MeanKL > own.MeanKL {
				t.Errorf("%s with a %s cache: nrmse %.2e, mean KL %.2e from llama.cpp's with it; llama.cpp's F16 and %s caches differ by %.2e, %.2e",
					c.Name, kt, ours.NRMSE, ours.MeanKL, kt, own.NRMSE, own.MeanKL)
			}
		}
	}
	if n == 0 {
		t.Fatal("no case keeps logits of quantized caches")
	}
}

// oracleOn runs case c's prompt in one batch on a runner of its model, on
// the device dev gives for it (the CPU when dev is nil), and compares the
// logits of every position with llama.cpp's.
func oracleOn(t *testing.T, c enginetest.OracleCase, dev func(*model.Model) device.Device) {
	m := enginetest.OpenPath(t, c.Model)
	if m.NVocab != c.NVocab {
		t.Fatalf("n_vocab %d, oracle says %d", m.NVocab, c.NVocab)
	}
	o := model.Options{Threads: 2, CacheTokens: 128}
	label := ""
	if dev != nil {
		o.Device = dev(m)
		label = o.Device.Name() + " "
	}
	r, err := model.NewRunner(m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.Prompt(0, c.Tokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	mt := enginetest.Compare(c.Logits, got, c.NVocab)
	float := enginetest.IsFloat(m.File)
	t.Logf("ORACLE %s%-14s float=%-5v %s", label, c.Name, float, mt)
	if err := mt.Check(float); err != nil {
		t.Error(err)
	}
}
