package fingerprint

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// probeCache is what the data dir keeps of the measured numbers: the
// figures in use (the medians of Samples), the samples they come from,
// and Pinned for figures Record set, which Remeasure leaves alone.
type probeCache struct {
	Version  string    `json:"version"`
	Method   string    `json:"method"` // how GFLOPS was measured; another method re-probes
	Cores    int       `json:"cores"`
	Threads  int       `json:"threads,omitempty"` // the kernels' threads the figures were measured with
	GFLOPS   float64   `json:"gflops"`
	MemGBps  float64   `json:"mem_gbps"`
	ProbedAt time.Time `json:"probed_at"`
	Samples  []Sample  `json:"samples,omitempty"`
	Pinned   bool      `json:"pinned,omitempty"`
}

// Sample is one measurement of the machine's compute and memory rate.
type Sample struct {
	GFLOPS  float64   `json:"gflops"`
	MemGBps float64   `json:"mem_gbps"`
	At      time.Time `json:"at"`
}

// keepSamples is how many measurements the figures are the medians of.
const keepSamples = 7

const probeFile = "capabilities.json"

// probeMethod names the GFLOPS measurement (cached numbers from another are
// measured again).
const probeMethod = "kernels-q8_0-n8,decode-stream,agent-threads"

// Machine is what this machine offers: memory in bytes (the agent's cgroup
// limit when lower than the machine's), cores, the GFLOPS and memory GB/s
// the engine's kernels measured, and what they compute on.
type Machine struct {
	MemTotal, MemFree uint64
	Cores             int
	GFLOPS            float64
	MemGBps           float64
	Accel             string
}

// Probe measures the machine with the kernels' threads the agent runs
// (threads; every core if 0), reusing the numbers cached in dir
// (capabilities.json) when the core count, the threads and the method
// have not changed. version is recorded with the numbers. d bounds each
// measurement.
//
// The threads are the agent's, not the machine's: in a cgroup quota of
// 0.9 of a core of two (an agent with --threads 1), two threads measured
// 94-120 GFLOPS and 9.5-12.1 GB/s where one measures 134-146 and
// 13.9-15.6, and the planner predicted that agent's prefill 19-24% and its
// decode 30% slow.
func Probe(dir, version string, d time.Duration, threads int) Machine {
	threads = probeThreads(threads)
	total, free := memInfo()
	c := Machine{MemTotal: total, MemFree: free, Cores: runtime.NumCPU(), Accel: accelerator()}
	path := filepath.Join(dir, probeFile)
	var pc probeCache
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &pc) == nil && pc.Cores == c.Cores && pc.GFLOPS > 0 && pc.Method == probeMethod && (pc.Threads == threads || pc.Pinned) {
		c.GFLOPS, c.MemGBps = pc.GFLOPS, pc.MemGBps
		return c
	}
	sm := measure(d, threads)
	c.GFLOPS, c.MemGBps = sm.GFLOPS, sm.MemGBps
	_ = write(dir, probeCache{Version: version, Method: probeMethod, Cores: c.Cores, Threads: threads, GFLOPS: c.GFLOPS, MemGBps: c.MemGBps, ProbedAt: sm.At, Samples: []Sample{sm}})
	return c
}

// probeThreads is the kernels' threads an agent of threads runs.
func probeThreads(threads int) int {
	if threads <= 0 {
		return runtime.NumCPU()
	}
	return threads
}

// measure takes one sample with threads kernel threads, each rate
// measured for about d.
func measure(d time.Duration, threads int) Sample {
	s := Sample{GFLOPS: measureGFLOPS(d, threads), MemGBps: measureMemGBps(d, threads), At: time.Now().UTC()}
	// The bandwidth probe's 107 MB of matrices are garbage now; hand them
	// back to the OS at once rather than keep them resident beside the
	// model (a fresh agent serving TinyLlama Q4_0 at ctx 2048 held 716 MiB
	// after three requests, 620 MiB with this).
	debug.FreeOSMemory()
	return s
}

// Remeasure takes one more sample in dir (the agent does, in the
// background) and returns the figures to use: the medians of the last
// keepSamples samples, so that one busy moment, at start or later, does
// not decide what the planner believes; n is how many samples they come
// from. Figures Record pinned are returned as they are, with n 0.
func Remeasure(dir, version string, d time.Duration, threads int) (gflops, memGBps float64, n int) {
	threads = probeThreads(threads)
	path := filepath.Join(dir, probeFile)
	var pc probeCache
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &pc) == nil && pc.Pinned && pc.Method == probeMethod {
		return pc.GFLOPS, pc.MemGBps, 0
	}
	if pc.Method != probeMethod || pc.Cores != runtime.NumCPU() || pc.Threads != threads {
		pc = probeCache{}
	}
	if len(pc.Samples) == 0 && pc.GFLOPS > 0 {
		pc.Samples = []Sample{{GFLOPS: pc.GFLOPS, MemGBps: pc.MemGBps, At: pc.ProbedAt}} // a cache of one figure
	}
	sm := measure(d, threads)
	pc.Samples = append(pc.Samples, sm)
	if k := len(pc.Samples) - keepSamples; k > 0 {
		pc.Samples = pc.Samples[k:]
	}
	pc.Version, pc.Method, pc.Cores, pc.Threads, pc.ProbedAt = version, probeMethod, runtime.NumCPU(), threads, sm.At
	pc.GFLOPS, pc.MemGBps = medians(pc.Samples)
	_ = write(dir, pc)
	return pc.GFLOPS, pc.MemGBps, len(pc.Samples)
}

// medians of the samples' two rates.
func medians(ss []Sample) (gflops, memGBps float64) {
	g := make([]float64, len(ss))
	m := make([]float64, len(ss))
	for i, s := range ss {
		g[i], m[i] = s.GFLOPS, s.MemGBps
	}
	return median(g), median(m)
}

func median(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	slices.Sort(x)
	if n := len(x); n%2 == 0 {
		return round3((x[n/2-1] + x[n/2]) / 2)
	}
	return x[len(x)/2]
}

// Record keeps gflops and memGBps in dir as if Probe had measured them
// there, pinned: the next Probe in dir uses them and Remeasure leaves
// them (a test cluster whose nodes differ in speed by design, not by the
// noise of a loaded host).
func Record(dir, version string, gflops, memGBps float64) error {
	return write(dir, probeCache{Version: version, Method: probeMethod, Cores: runtime.NumCPU(), GFLOPS: gflops, MemGBps: memGBps, ProbedAt: time.Now().UTC(), Pinned: true})
}

func write(dir string, pc probeCache) error {
	b, err := json.MarshalIndent(pc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, probeFile), b, 0o600)
}

// measureGFLOPS times the engine's own kernels on threads threads for about d:
// a Q8_0 matrix (in cache) against a small batch of activations, the
// shape of a decode step of a few sequences. (A plain float32 loop measured
// 5-9x less than the quantized kernels do, so the planner's compute term
// drowned the memory term it should be next to.)
func measureGFLOPS(d time.Duration, threads int) float64 {
	const rows, cols, n = 512, 2048, 8
	p := kernels.NewPool(threads)
	defer p.Close()
	m := &kernels.Matrix{Type: quant.Q8_0, Rows: rows, Cols: cols, RowSize: quant.Q8_0.RowSize(cols)}
	m.Data = make([]byte, rows*m.RowSize)
	x := make([]float32, max(rows, n)*cols)
	for i := range x {
		x[i] = float32(i%13-6) * 0.01
	}
	for r := 0; r < rows; r++ {
		quant.QuantizeRow(quant.Q8_0, x[r*cols:(r+1)*cols], m.Data[r*m.RowSize:(r+1)*m.RowSize])
	}
	xq := make([]byte, n*m.ActRowSize())
	kernels.QuantizeActs(p, m.ActType(), x[:n*cols], n, cols, xq)
	out := make([]float32, n*rows)
	kernels.MatMul(p, m, xq, n, out, rows) // warm up
	start, k := time.Now(), 0
	for k < 4 || time.Since(start) < d {
		kernels.MatMul(p, m, xq, n, out, rows)
		k++
	}
	return round3(2 * rows * cols * n * float64(k) / time.Since(start).Seconds() / 1e9)
}

// measureMemGBps streams Q8_0 weights far larger than caches through the
// engine's decode kernel (one activation row) on threads threads for about d:
// the bytes of weights read per second, the rate a decode step reads
// memory at. (A buffer copy counts writes too and overstated it about 2x.)
func measureMemGBps(d time.Duration, threads int) float64 {
	const rows, cols, mats = 4096, 4096, 6 // 6 x 17.8 MB
	p := kernels.NewPool(threads)
	defer p.Close()
	ms := make([]*kernels.Matrix, mats)
	for i := range ms {
		m := &kernels.Matrix{Type: quant.Q8_0, Rows: rows, Cols: cols, RowSize: quant.Q8_0.RowSize(cols)}
		m.Data = make([]byte, rows*m.RowSize)
		for j := range m.Data {
			m.Data[j] = 0x11 // written, so the pages are real; scales stay small normals
		}
		ms[i] = m
	}
	x := make([]float32, cols)
	for i := range x {
		x[i] = float32(i%13-6) * 0.01
	}
	xq := make([]byte, ms[0].ActRowSize())
	kernels.QuantizeActs(p, ms[0].ActType(), x, 1, cols, xq)
	out := make([]float32, rows)
	for _, m := range ms {
		kernels.MatMul(p, m, xq, 1, out, rows)
	}
	start, k := time.Now(), 0
	for k < 2*mats || time.Since(start) < d {
		kernels.MatMul(p, ms[k%mats], xq, 1, out, rows)
		k++
	}
	return round3(float64(k) * float64(len(ms[0].Data)) / time.Since(start).Seconds() / 1e9)
}

// round3 keeps three significant digits, so slow machines (or -race runs)
// still report a positive figure.
func round3(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 3, 64), 64)
	return v
}

// accelerator names what the engine computes on: the CPU and its active
// kernel set ("cpu/avx512", "cpu/neon-dot", "cpu/generic"). The engine has
// no GPU backend, so a GPU in the machine is not reported.
func accelerator() string { return "cpu/" + kernels.Path() }
