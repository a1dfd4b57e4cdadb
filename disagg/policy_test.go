package disagg

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Model shapes: F16 K and V over every layer and KV head.
const (
	tinyLlamaKV = 2 * 22 * 4 * 64 * 2  // 22 layers, 4 KV heads of 64: 22 KiB/token
	llama3_8bKV = 2 * 32 * 8 * 128 * 2 // 32 layers, 8 KV heads of 128: 128 KiB/token
)

func tiny(local, remote, gbit float64) CostModel {
	return CostModel{KVBytesPerToken: tinyLlamaKV, Layers: 22, LocalPrefillTokPerSec: local, RemotePrefillTokPerSec: remote, LinkGbit: gbit, LinkLatencyMs: 0.5}
}

func llama8b(local, remote, gbit float64) CostModel {
	return CostModel{KVBytesPerToken: llama3_8bKV, Layers: 32, LocalPrefillTokPerSec: local, RemotePrefillTokPerSec: remote, LinkGbit: gbit, LinkLatencyMs: 0.5}
}

func TestModelShapes(t *testing.T) {
	if tinyLlamaKV != 22<<10 || llama3_8bKV != 128<<10 {
		t.Fatalf("KV per token: TinyLlama %d, Llama-3-8B %d", tinyLlamaKV, llama3_8bKV)
	}
}

func TestDecide(t *testing.T) {
	withLatency := tiny(1000, 2000, 10)
	withLatency.LinkLatencyMs = 500 // a far prefill pool
	noFloor := llama8b(1000, 4000, 10)
	noFloor.MinUncached = 1
	strict := llama8b(1000, 2000, 10)
	strict.Margin = 0.5
	noOverlap := llama8b(1000, 1500, 10)
	noOverlap.Layers = 0
	cases := []struct {
		name   string
		cm     CostModel
		tokens int
		mode   Mode
		remote bool
		reason string
	}{
		// Llama-3-8B: 128 KiB/token, 1 GbE moves only ~950 tok/s of KV.
		{"8b 8K 1GbE comparable compute", llama8b(1000, 1000, 1), 8192, ModeAuto, false, "never saves 20%"},
		{"8b 8K 1GbE 4x prefill is link-bound", llama8b(1000, 4000, 1), 8192, ModeAuto, false, "link: 1 Gbit/s moves 954 tok/s of KV"},
		{"8b 8K 10GbE 4x prefill", llama8b(1000, 4000, 10), 8192, ModeAuto, true, "remote: 8192 uncached tokens, threshold 1000; predicted 2.08s remote (prefill 2.05s, 1.00 GiB of KV in 859ms) against 8.19s local"},
		{"8b 8K 10GbE 2x prefill", llama8b(1000, 2000, 10), 8192, ModeAuto, true, "remote"},
		{"8b 8K 10GbE comparable", llama8b(1000, 1000, 10), 8192, ModeAuto, false, "(prefill-bound)"},
		{"8b 8K 10GbE 1.2x saves too little", llama8b(1000, 1200, 10), 8192, ModeAuto, false, "never saves 20%"},
		{"8b 8K 10GbE slower pool", llama8b(1000, 500, 10), 8192, ModeAuto, false, "never"},
		{"8b 500 tokens 10GbE 4x under the floor", llama8b(1000, 4000, 10), 500, ModeAuto, false, "500 uncached tokens, below the threshold of 1000"},
		{"8b 999 tokens", llama8b(1000, 4000, 10), 999, ModeAuto, false, "below the threshold of 1000"},
		{"8b 1000 tokens", llama8b(1000, 4000, 10), 1000, ModeAuto, true, "threshold 1000"},
		{"8b no floor, 200 tokens", noFloor, 200, ModeAuto, true, "threshold 1;"},
		{"8b 2x, margin 50%", strict, 8192, ModeAuto, false, "never saves 50%"},
		{"8b 1.5x without overlap", noOverlap, 8192, ModeAuto, true, "remote"},
		// TinyLlama: 22 KiB/token, 1 GbE moves ~5500 tok/s of KV.
		{"tiny 2K CPU to GPU 1GbE", tiny(300, 6000, 1), 2048, ModeAuto, true, "remote"},
		{"tiny 800 CPU to GPU 1GbE, under the floor", tiny(300, 6000, 1), 800, ModeAuto, false, "below the threshold of 1000"},
		{"tiny 8K 1GbE comparable", tiny(2000, 2000, 1), 8192, ModeAuto, false, "never"},
		{"tiny 8K 1GbE 4x", tiny(1500, 6000, 1), 8192, ModeAuto, true, "remote"},
		{"tiny 16x prefill, link-bound but remote", tiny(1500, 24000, 1), 8192, ModeAuto, true, "remote"},
		{"tiny far pool, 1500 tokens", withLatency, 1500, ModeAuto, false, "below the threshold of 1672"},
		{"tiny far pool, 4K tokens", withLatency, 4096, ModeAuto, true, "threshold 1672"},
		// Modes.
		{"on, short prompt", llama8b(1000, 1000, 1), 10, ModeOn, true, "remote: disaggregation is on (10 uncached tokens)"},
		{"on, nothing to prefill", llama8b(1000, 4000, 10), 0, ModeOn, false, "nothing to prefill"},
		{"on, incomplete cost model", CostModel{}, 5000, ModeOn, true, "on"},
		{"off, long prompt remote would win", llama8b(1000, 4000, 10), 8192, ModeOff, false, "local: disaggregation is off"},
		{"auto, nothing to prefill", llama8b(1000, 4000, 10), 0, ModeAuto, false, "nothing to prefill"},
		{"auto, incomplete cost model", CostModel{KVBytesPerToken: 1024, LocalPrefillTokPerSec: 100}, 5000, ModeAuto, false, "bad remote prefill tok/s 0, link Gbit/s 0"},
		{"unknown mode", llama8b(1000, 4000, 10), 8192, Mode(7), false, "unknown mode Mode(7)"},
	}
	for _, tc := range cases {
		d := Decide(tc.tokens, tc.cm, tc.mode)
		if d.Remote != tc.remote || !strings.Contains(d.Reason, tc.reason) {
			t.Errorf("%s: remote %v (%s); want remote %v and a reason containing %q", tc.name, d.Remote, d.Reason, tc.remote, tc.reason)
		}
		if d.Mode != tc.mode || d.Uncached != tc.tokens {
			t.Errorf("%s: decision carries mode %v, %d tokens", tc.name, d.Mode, d.Uncached)
		}
	}
}

// TestPredict checks the overlap model's numbers on one case by hand.
func TestPredict(t *testing.T) {
	cm := llama8b(1000, 4000, 10)
	p := Predict(8192, cm)
	transfer := 8192.0 * llama3_8bKV * 8 / 10e9 * 1000 // ms on the wire
	prefill := 8192.0 / 4000 * 1000
	want := Prediction{
		LocalMs:         8192,
		RemotePrefillMs: prefill,
		TransferMs:      transfer,
		RemoteMs:        prefill + transfer/32 + 0.5, // the link keeps up: the last layer's KV after the prefill
		TransferBytes:   8192 * llama3_8bKV,
	}
	if !approxEq(p.LocalMs, want.LocalMs) || !approxEq(p.RemoteMs, want.RemoteMs) || !approxEq(p.RemotePrefillMs, want.RemotePrefillMs) ||
		!approxEq(p.TransferMs, want.TransferMs) || p.TransferBytes != want.TransferBytes {
		t.Fatalf("prediction %+v, want %+v", p, want)
	}
	// Link-bound: the first layer's prefill, then the whole transfer.
	cm = llama8b(1000, 4000, 1)
	p = Predict(8192, cm)
	if w := 8192.0/4000*1000/32 + 8192.0*llama3_8bKV*8/1e9*1000 + 0.5; !approxEq(p.RemoteMs, w) {
		t.Fatalf("link-bound remote %v ms, want %v", p.RemoteMs, w)
	}
	// No overlap with Layers 0: prefill then transfer.
	cm.Layers = 0
	if p, w := Predict(100, cm), 100.0/4000*1000+100.0*llama3_8bKV*8/1e9*1000+0.5; !approxEq(p.RemoteMs, w) {
		t.Fatalf("no overlap: remote %v ms, want %v", p.RemoteMs, w)
	}
	if p := Predict(100, CostModel{}); p != (Prediction{}) {
		t.Fatalf("incomplete model predicts %+v", p)
	}
}

func approxEq(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestThreshold(t *testing.T) {
	far := tiny(1000, 2000, 10)
	far.LinkLatencyMs = 500
	farNoFloor := far
	farNoFloor.MinUncached = 1
	cases := []struct {
		name string
		cm   CostModel
		want int
	}{
		{"floor dominates", llama8b(1000, 4000, 10), 1000},
		{"link-bound never", llama8b(1000, 4000, 1), -1},
		{"comparable never", llama8b(1000, 1000, 10), -1},
		// gain per token (0.8·1 - (0.5 + 0.0180224/22)) ms; 500 ms / gain.
		{"far pool", far, 1672},
		{"far pool, floor 1", farNoFloor, 1672},
		{"no latency, floor 1", CostModel{KVBytesPerToken: 1, LocalPrefillTokPerSec: 1, RemotePrefillTokPerSec: 100, LinkGbit: 1, MinUncached: 1}, 1},
		{"floor 5000", CostModel{KVBytesPerToken: 1, LocalPrefillTokPerSec: 1, RemotePrefillTokPerSec: 100, LinkGbit: 1, MinUncached: 5000}, 5000},
		{"break-even beyond any context", CostModel{KVBytesPerToken: 1, LocalPrefillTokPerSec: 1000, RemotePrefillTokPerSec: 1251, LinkGbit: 100, LinkLatencyMs: 1e9}, -1},
		{"incomplete", CostModel{}, -1},
		{"NaN rate", CostModel{KVBytesPerToken: 1, LocalPrefillTokPerSec: math.NaN(), RemotePrefillTokPerSec: 1, LinkGbit: 1}, -1},
		{"margin 1", CostModel{KVBytesPerToken: 1, LocalPrefillTokPerSec: 1, RemotePrefillTokPerSec: 1000, LinkGbit: 1, Margin: 1}, -1},
	}
	for _, tc := range cases {
		if got := Threshold(tc.cm); got != tc.want {
			t.Errorf("%s: Threshold = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestThresholdIsBreakEven: over random cost models, auto goes remote
// exactly from Threshold on, remote then saves the margin, and one token
// less (above the floor) it does not.
func TestThresholdIsBreakEven(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	remote := 0
	for i := 0; i < 5000; i++ {
		cm := CostModel{
			KVBytesPerToken:        1 + rnd.IntN(256<<10),
			Layers:                 rnd.IntN(100),
			LocalPrefillTokPerSec:  10 + 20000*rnd.Float64(),
			RemotePrefillTokPerSec: 10 + 50000*rnd.Float64(),
			LinkGbit:               0.1 + 100*rnd.Float64(),
			LinkLatencyMs:          1000 * rnd.Float64() * rnd.Float64(),
			Margin:                 0.5 * rnd.Float64(),
			MinUncached:            1 + rnd.IntN(2000),
		}
		thr := Threshold(cm)
		for _, n := range []int{1, thr - 1, thr, thr + 1, 1 << 20} {
			if n <= 0 {
				continue
			}
			d := Decide(n, cm, ModeAuto)
			if d.Threshold != thr || d.Remote != (thr > 0 && n >= thr) {
				t.Fatalf("%+v, %d tokens: remote %v, threshold %d (%s)", cm, n, d.Remote, thr, d.Reason)
			}
			saves := d.RemoteMs <= (1-cm.Margin)*d.LocalMs*(1+1e-9)
			if d.Remote && !saves {
				t.Fatalf("%+v, %d tokens: remote at %v ms against %v ms local does not save %v", cm, n, d.RemoteMs, d.LocalMs, cm.Margin)
			}
			if !d.Remote && n >= cm.MinUncached && d.RemoteMs < (1-cm.Margin)*d.LocalMs*(1-1e-9) {
				t.Fatalf("%+v, %d tokens: local although remote at %v ms saves the margin on %v ms (threshold %d)", cm, n, d.RemoteMs, d.LocalMs, thr)
			}
			if d.Remote {
				remote++
			}
		}
	}
	if remote == 0 {
		t.Fatal("no random cost model went remote: the property was never exercised")
	}
}

func TestCostModelCheck(t *testing.T) {
	good := llama8b(1000, 4000, 10)
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		edit func(*CostModel)
		want string
	}{
		{func(c *CostModel) { c.KVBytesPerToken = 0 }, "bad KV bytes per token 0"},
		{func(c *CostModel) { c.Layers = -1 }, "layers -1"},
		{func(c *CostModel) { c.LocalPrefillTokPerSec = -5 }, "local prefill tok/s -5"},
		{func(c *CostModel) { c.RemotePrefillTokPerSec = math.Inf(1) }, "remote prefill tok/s +Inf"},
		{func(c *CostModel) { c.LinkGbit = math.NaN() }, "link Gbit/s NaN"},
		{func(c *CostModel) { c.LinkLatencyMs = -1 }, "link latency -1 ms"},
		{func(c *CostModel) { c.Margin = 1.5 }, "margin 1.5 (want [0,1))"},
		{func(c *CostModel) { c.MinUncached = -3 }, "min uncached tokens -3"},
	} {
		cm := good
		tc.edit(&cm)
		if err := cm.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", cm, err, tc.want)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mode
		ok   bool
	}{{"auto", ModeAuto, true}, {"on", ModeOn, true}, {"off", ModeOff, true}, {"", 0, false}, {"On", 0, false}, {"yes", 0, false}} {
		m, err := ParseMode(tc.in)
		if (err == nil) != tc.ok || m != tc.want {
			t.Errorf("ParseMode(%q) = %v, %v", tc.in, m, err)
		}
	}
	if Mode(0) != ModeAuto {
		t.Fatal("the zero Mode is not auto")
	}
}

func FuzzParseMode(f *testing.F) {
	for _, s := range []string{"auto", "on", "off", "", "Mode(3)", "onn"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMode(s)
		if err != nil {
			if m != 0 {
				t.Fatalf("ParseMode(%q) failed but returned %v", s, m)
			}
			return
		}
		if m.String() != s {
			t.Fatalf("ParseMode(%q) = %v, which prints as %q", s, m, m.String())
		}
	})
}

func TestPick(t *testing.T) {
	if Pick(nil, nil) != -1 || Pick([]Worker{}, rand.New(rand.NewPCG(1, 1))) != -1 {
		t.Fatal("no workers: want -1")
	}
	cases := []struct {
		name    string
		workers []Worker
		want    int
	}{
		{"one", []Worker{{}}, 0},
		{"more cached wins", []Worker{{CachedBlocks: 0, QueuedBlocks: 10}, {CachedBlocks: 6, QueuedBlocks: 10}, {CachedBlocks: 3, QueuedBlocks: 10}}, 1},
		{"less queued wins", []Worker{{QueuedBlocks: 40}, {QueuedBlocks: 12}, {QueuedBlocks: 30}}, 1},
		{"a long queue outweighs a short cached prefix", []Worker{{CachedBlocks: 8, QueuedBlocks: 200}, {CachedBlocks: 0, QueuedBlocks: 3}}, 1},
		{"a long cached prefix outweighs a short queue", []Worker{{CachedBlocks: 0, QueuedBlocks: 0}, {CachedBlocks: 120, QueuedBlocks: 20}}, 1},
		{"negative counts count as zero", []Worker{{CachedBlocks: -50}, {QueuedBlocks: -50}, {CachedBlocks: 4}}, 2},
	}
	for _, tc := range cases {
		if got := Pick(tc.workers, nil); got != tc.want {
			t.Errorf("%s, no randomness: picked %d, want %d", tc.name, got, tc.want)
		}
		// A worker better by more than PickJitter wins whatever the draw.
		rnd := rand.New(rand.NewPCG(7, 7))
		for i := 0; i < 500; i++ {
			if got := Pick(tc.workers, rnd); got != tc.want {
				t.Fatalf("%s, draw %d: picked %d, want %d", tc.name, i, got, tc.want)
			}
		}
	}
	if got := Pick([]Worker{{QueuedBlocks: 3}, {QueuedBlocks: 3}}, nil); got != 0 {
		t.Fatalf("a tie without randomness goes to the lowest index, got %d", got)
	}
}

// TestPickSpreads: ties are shared evenly, and a worker one block worse
// than the best still gets an eighth of the requests ((2-1)²/(2·2²)).
func TestPickSpreads(t *testing.T) {
	const n = 8000
	rnd := rand.New(rand.NewPCG(3, 4))
	ties := []Worker{{CachedBlocks: 2, QueuedBlocks: 9}, {CachedBlocks: 2, QueuedBlocks: 9}, {CachedBlocks: 2, QueuedBlocks: 9}, {CachedBlocks: 2, QueuedBlocks: 9}}
	var got [4]int
	for i := 0; i < n; i++ {
		got[Pick(ties, rnd)]++
	}
	for i, c := range got {
		if c < n/4*9/10 || c > n/4*11/10 {
			t.Errorf("tied worker %d picked %d of %d times, want about %d: %v", i, c, n, n/4, got)
		}
	}
	near := []Worker{{QueuedBlocks: 10}, {QueuedBlocks: 11}}
	worse := 0
	for i := 0; i < n; i++ {
		if Pick(near, rnd) == 1 {
			worse++
		}
	}
	if lo, hi := n/8*8/10, n/8*12/10; worse < lo || worse > hi {
		t.Errorf("the worker one block worse was picked %d of %d times, want about %d", worse, n, n/8)
	}
}

// TestIsolationRule: with Isolation a prefill pool no faster than the
// decode pool still takes long prompts when the KV moves much cheaper than
// it is computed (the decode pool's streams keep their pace), never short
// ones (the floor), never over a link too slow for the KV, and never when
// the remote time would exceed the local one by more than the isolation.
func TestIsolationRule(t *testing.T) {
	iso := func(cm CostModel) CostModel { cm.Isolation = 0.25; return cm }
	busy := func(cm CostModel, n int) CostModel { cm.Streams = n; return cm }
	cases := []struct {
		name   string
		cm     CostModel
		tokens int
		remote bool
	}{
		{"tiny, equal 1-core devices, 10GbE, 1K prompt", iso(tiny(130, 130, 10)), 1024, true},
		{"tiny, equal, 1GbE", iso(tiny(130, 130, 1)), 1024, true},
		{"tiny, equal, 10GbE, short prompt", iso(tiny(130, 130, 10)), 17, false},
		{"tiny, equal, a link too slow for the KV", iso(tiny(130, 130, 0.01)), 1024, false},
		{"tiny, prefill pool 2x slower", iso(tiny(130, 65, 10)), 4096, false},
		// 8 streams would stall behind a local prefill: 2x slower remote
		// is the better trade, 4x with 2 streams is not.
		{"tiny, prefill pool 2x slower, 8 streams decoding", busy(iso(tiny(130, 65, 10)), 8), 4096, true},
		{"tiny, prefill pool 4x slower, 2 streams decoding", busy(iso(tiny(130, 32, 10)), 2), 4096, false},
		{"tiny, equal, a link too slow for the KV, 8 streams", busy(iso(tiny(130, 130, 0.01)), 8), 1024, false},
		{"tiny, prefill pool 1.2x slower", iso(tiny(130, 110, 10)), 4096, true},
		{"8b, equal, 1GbE moves the KV slower than it is computed", iso(llama8b(1000, 1000, 1)), 8192, false},
		{"without isolation, equal nodes stay local", tiny(130, 130, 10), 1024, false},
	}
	for _, c := range cases {
		d := Decide(c.tokens, c.cm, ModeAuto)
		if d.Remote != c.remote {
			t.Errorf("%s: remote %v, want %v (%s)", c.name, d.Remote, c.remote, d.Reason)
		}
		if bound := 1 + c.cm.Isolation*float64(1+c.cm.Streams); d.Remote && d.RemoteMs > bound*d.LocalMs*(1+1e-9) {
			t.Errorf("%s: remote at %v ms exceeds %v x the local %v ms", c.name, d.RemoteMs, bound, d.LocalMs)
		}
	}
	if err := (CostModel{KVBytesPerToken: 1, LocalPrefillTokPerSec: 1, RemotePrefillTokPerSec: 1, LinkGbit: 1, Isolation: -1}).Check(); err == nil {
		t.Error("a negative isolation passes Check")
	}
	if err := (CostModel{KVBytesPerToken: 1, LocalPrefillTokPerSec: 1, RemotePrefillTokPerSec: 1, LinkGbit: 1, Streams: -1}).Check(); err == nil {
		t.Error("a negative stream count passes Check")
	}
}
