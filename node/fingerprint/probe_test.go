package fingerprint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestProbeCache: numbers cached by the same method on the same core count
// are reused; another method's are measured again, and the new numbers
// are cached.
func TestProbeCache(t *testing.T) {
	dir := t.TempDir()
	write := func(pc probeCache) {
		b, err := json.Marshal(pc)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, probeFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(probeCache{Method: probeMethod, Cores: runtime.NumCPU(), Threads: 3, GFLOPS: 1234, MemGBps: 56})
	m := Probe(dir, "v1", time.Millisecond, 3)
	if m.GFLOPS != 1234 || m.MemGBps != 56 || m.Cores != runtime.NumCPU() || m.Accel == "" {
		t.Fatalf("cached numbers not reused: %+v", m)
	}
	// An agent of another thread count measures its own (an agent held to
	// one core of two measured a fifth less with two threads).
	write(probeCache{Method: probeMethod, Cores: runtime.NumCPU(), Threads: 3, GFLOPS: 1234, MemGBps: 56})
	if m = Probe(dir, "v1", time.Millisecond, 1); m.GFLOPS == 1234 || m.GFLOPS <= 0 {
		t.Fatalf("numbers of 3 threads reused for 1: %+v", m)
	}

	write(probeCache{Method: "another", Cores: runtime.NumCPU(), GFLOPS: 1234, MemGBps: 56})
	m = Probe(dir, "v1", time.Millisecond, 0)
	if m.GFLOPS == 1234 || m.GFLOPS <= 0 || m.MemGBps <= 0 {
		t.Fatalf("another method's numbers reused or nothing measured: %+v", m)
	}
	b, err := os.ReadFile(filepath.Join(dir, probeFile))
	if err != nil {
		t.Fatal(err)
	}
	var pc probeCache
	if err := json.Unmarshal(b, &pc); err != nil {
		t.Fatal(err)
	}
	if pc.Method != probeMethod || pc.Version != "v1" || pc.GFLOPS != m.GFLOPS || pc.MemGBps != m.MemGBps {
		t.Fatalf("cache %+v does not hold the measured %+v", pc, m)
	}
}

// TestRecord: numbers recorded in a dir are what Probe finds there.
func TestRecord(t *testing.T) {
	dir := t.TempDir()
	if err := Record(dir, "v1", 12.5, 3.25); err != nil {
		t.Fatal(err)
	}
	if m := Probe(dir, "v1", time.Millisecond, 0); m.GFLOPS != 12.5 || m.MemGBps != 3.25 {
		t.Fatalf("recorded 12.5 GFLOPS and 3.25 GB/s, Probe found %+v", m)
	}
}

// TestRemeasure: the figures are the medians of the last samples, so one
// busy moment (a tenth of the usual rate) does not move them; the sample
// list stays bounded; figures Record pinned are never measured over.
func TestRemeasure(t *testing.T) {
	dir := t.TempDir()
	samples := []Sample{{GFLOPS: 1.5, MemGBps: 0.2}} // measured while the host was busy
	for range 5 {
		samples = append(samples, Sample{GFLOPS: 1e6, MemGBps: 1e4}) // far above anything measured here
	}
	b, err := json.Marshal(probeCache{Method: probeMethod, Cores: runtime.NumCPU(), Threads: runtime.NumCPU(), GFLOPS: 1.5, MemGBps: 0.2, Samples: samples})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, probeFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	g, m, n := Remeasure(dir, "v1", time.Millisecond, 0)
	if n != 7 || g != 1e6 || m != 1e4 {
		t.Fatalf("after one more sample: %v GFLOPS, %v GB/s from %d samples; want the medians 1e6 and 1e4 of 7", g, m, n)
	}
	if p := Probe(dir, "v1", time.Millisecond, 0); p.GFLOPS != g || p.MemGBps != m {
		t.Fatalf("the next start uses %v and %v, want the medians", p.GFLOPS, p.MemGBps)
	}
	for range 3 {
		_, _, n = Remeasure(dir, "v1", time.Millisecond, 0)
	}
	if n != keepSamples {
		t.Fatalf("%d samples kept, want %d", n, keepSamples)
	}

	if err := Record(dir, "v1", 12.5, 3.25); err != nil {
		t.Fatal(err)
	}
	if g, m, n := Remeasure(dir, "v1", time.Millisecond, 0); g != 12.5 || m != 3.25 || n != 0 {
		t.Fatalf("pinned 12.5 and 3.25, Remeasure gave %v %v (n %d)", g, m, n)
	}
}
