package model_test

import (
	"testing"

	"shoal/engine/device"
	"shoal/engine/enginetest"
	"shoal/engine/model"
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
