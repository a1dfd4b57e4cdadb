package model_test

import (
	"testing"

	"shoal/engine/device/vulkan"
	"shoal/engine/enginetest"
	"shoal/engine/model"
)

// TestOracleVulkan runs every case of ../shared/oracle with the whole model
// on the Vulkan device (lavapipe in CI) and compares the logits with
// llama.cpp's by the same tolerances as the CPU.
func TestOracleVulkan(t *testing.T) {
	g := enginetest.VulkanOrSkip(t)
	for _, c := range enginetest.OracleCases(t) {
		t.Run(c.Name, func(t *testing.T) {
			m := enginetest.OpenPath(t, c.Model)
			r, err := model.NewRunner(m, model.Options{Threads: 2, CacheTokens: 128, Device: vulkan.Device{GPU: g}})
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
			t.Logf("ORACLE vulkan %-14s float=%-5v %s", c.Name, float, mt)
			if err := mt.Check(float); err != nil {
				t.Error(err)
			}
		})
	}
}
