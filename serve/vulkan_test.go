package serve

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"shoal/engine/device/vulkan"
	"shoal/engine/enginetest"
)

// TestVulkanGreedyText: the real trained models of ../shared/oracle give
// the same 64 greedy tokens on the Vulkan device as on the CPU, and 16
// streams batched together on the device each give the tokens they give
// alone (the device's kernels compute each row the same way whatever the
// batch, so this holds exactly).
func TestVulkanGreedyText(t *testing.T) {
	g := enginetest.VulkanOrSkip(t)
	ran := 0
	for _, c := range enginetest.OracleCases(t) {
		if !strings.HasPrefix(c.Name, "real-") {
			continue
		}
		ran++
		t.Run(c.Name, func(t *testing.T) {
			m := enginetest.OpenPath(t, c.Model)
			o := Options{MaxSeqs: 16, MaxTokens: 256}
			cpuS := newSched(t, m, 4096, o)
			gpuS := newSchedOn(t, m, 4096, vulkan.Device{GPU: g}, o)
			one := func(s *Scheduler, p []int32, n int) []int32 {
				ch, err := s.Submit(context.Background(), Request{Prompt: p, MaxTokens: n, Sampling: greedy()})
				if err != nil {
					t.Fatal(err)
				}
				toks, _ := collect(t, ch)
				return toks
			}
			want, got := one(cpuS, c.Tokens, 64), one(gpuS, c.Tokens, 64)
			if len(want) != 64 || !slices.Equal(want, got) {
				t.Fatalf("64 greedy tokens:\ncpu    %v\nvulkan %v", want, got)
			}
			t.Logf("64 greedy tokens equal on the CPU and on %s", g.Info().Name)

			const streams = 16
			prompts := make([][]int32, streams)
			alone := make([][]int32, streams)
			for i := range prompts {
				prompts[i] = append(slices.Clone(c.Tokens[:1+i%len(c.Tokens)]), prompt(i, 3+i)...)
				for j := range prompts[i] {
					prompts[i][j] %= int32(m.NVocab)
				}
				alone[i] = one(gpuS, prompts[i], 24)
			}
			batched := make([][]int32, streams)
			var wg sync.WaitGroup
			for i := range prompts {
				ch, err := gpuS.Submit(context.Background(), Request{Prompt: prompts[i], MaxTokens: 24, Sampling: greedy()})
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() { defer wg.Done(); batched[i], _ = collect(t, ch) }()
			}
			wg.Wait()
			for i := range batched {
				if len(batched[i]) != 24 || !slices.Equal(batched[i], alone[i]) {
					t.Errorf("stream %d: batched %v, alone %v", i, batched[i], alone[i])
				}
			}
			if st := gpuS.Stats(); st.Completed < 2*streams {
				t.Errorf("the device's scheduler completed %d requests, want %d", st.Completed, 2*streams+1)
			}
			t.Logf("%d streams batched on the device: each gave its tokens alone", streams)
		})
	}
	if ran == 0 {
		t.Skip(fmt.Sprintf("no real-* case in %s", enginetest.OracleDir()))
	}
}
