package bench

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"shoal/engine/enginetest"
	"shoal/engine/model"
	"shoal/engine/synth"
)

func TestTriadKernel(t *testing.T) {
	for _, n := range []int{0, 1, 15, 16, 17, 100, 4099} {
		a, b, c := make([]float64, n), make([]float64, n), make([]float64, n)
		want := make([]float64, n)
		for i := range b {
			b[i], c[i] = float64(i), 0.25*float64(i)
		}
		triadKernel(a, b, c, 3)
		triadGo(want, b, c, 3)
		for i := range a {
			if a[i] != want[i] {
				t.Fatalf("n=%d: a[%d] = %v, want %v", n, i, a[i], want[i])
			}
		}
	}
	if bw := MemBandwidth(1, 8, 1); bw <= 0 {
		t.Fatalf("bandwidth %v", bw)
	}
}

// testModel writes a small llama model of weight type typ and opens it.
func testModel(t *testing.T, typ string) *model.Model {
	t.Helper()
	return enginetest.Open(t, synth.Spec{Arch: "llama", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, Ctx: 64, Type: typ})
}

// A MoE model's decode reads the routed experts a token uses, not all.
func TestBytesPerTokenMoE(t *testing.T) {
	m := enginetest.Open(t, synth.Spec{Arch: "moe", NEmbd: 64, NLayer: 2, NHead: 4, NFF: 128, NExpert: 4, NExpertUsed: 1, Ctx: 64, Type: "q8_0"})
	var exps, rest int64
	for _, tn := range m.File.Tensors {
		switch {
		case strings.HasSuffix(tn.Name, "_exps.weight"):
			exps += int64(tn.Size)
		case tn.Name != "token_embd.weight":
			rest += int64(tn.Size)
		}
	}
	if exps == 0 {
		t.Fatal("the test model has no stacked experts")
	}
	if got, want := BytesPerToken(m), rest+exps/4; got != want {
		t.Fatalf("bytes per token %d, want %d (all but the embedding, a quarter of the experts)", got, want)
	}
}

func TestBenchRun(t *testing.T) {
	m := testModel(t, "q8_0")
	emb, _ := m.File.Tensor("token_embd.weight")
	if got, want := BytesPerToken(m), ModelBytes(m)-int64(emb.Size); got != want {
		t.Fatalf("bytes per token %d, want all but the embedding: %d", got, want)
	}
	res, err := Run(m, Options{Threads: []int{1, 2}, Prompt: []int{8}, Gen: []int{4}, Reps: 2, BandwidthMB: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d rows, want 4", len(res))
	}
	for _, r := range res {
		if r.TokPerSec <= 0 || len(r.Samples) != 2 {
			t.Fatalf("row %+v", r)
		}
		if r.Test == "tg4" && (r.BandwidthGBs <= 0 || r.Roofline <= 0) {
			t.Fatalf("tg row without bandwidth: %+v", r)
		}
	}
}

// With a depth every run starts from that many cached tokens, and the rows
// are named as llama-bench names them; a negative depth is an error.
func TestBenchDepth(t *testing.T) {
	m := testModel(t, "q4_0")
	res, err := Run(m, Options{Threads: []int{2}, Prompt: []int{8}, Gen: []int{4}, Reps: 1, BandwidthMB: 4, Depth: 40}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Test != "pp8 @ d40" || res[1].Test != "tg4 @ d40" || res[1].TokPerSec <= 0 {
		t.Fatalf("rows %+v", res)
	}
	if _, err := Run(m, Options{Threads: []int{1}, Gen: []int{4}, Reps: 1, BandwidthMB: 4, Depth: -1}, nil); err == nil {
		t.Error("a negative depth was accepted")
	}
}

func TestCPUName(t *testing.T) {
	n := CPUName()
	if n == "" {
		t.Fatal("empty CPU name")
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil || !strings.Contains(string(b), "model name") {
		t.Skipf("no model name in /proc/cpuinfo; CPUName gives %q", n)
	}
	if n == runtime.GOOS+"/"+runtime.GOARCH || !strings.Contains(string(b), n) {
		t.Errorf("CPUName %q is not the model name of /proc/cpuinfo", n)
	}
}
