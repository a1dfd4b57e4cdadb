package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"shoal/coordinator"
)

// probeCache is what the data dir keeps of the measured numbers.
type probeCache struct {
	Version  string    `json:"version"`
	Cores    int       `json:"cores"`
	GFLOPS   float64   `json:"gflops"`
	MemGBps  float64   `json:"mem_gbps"`
	ProbedAt time.Time `json:"probed_at"`
}

const probeFile = "capabilities.json"

// ProbeCapabilities measures the machine, reusing the numbers cached in dir
// when the core count has not changed. d bounds each measurement.
func ProbeCapabilities(dir, version string, d time.Duration) coordinator.Capabilities {
	total, free := memInfo()
	c := coordinator.Capabilities{MemTotal: total, MemFree: free, Cores: runtime.NumCPU(), Accel: accelerator()}
	path := filepath.Join(dir, probeFile)
	var pc probeCache
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &pc) == nil && pc.Cores == c.Cores && pc.GFLOPS > 0 {
		c.GFLOPS, c.MemGBps = pc.GFLOPS, pc.MemGBps
		return c
	}
	c.GFLOPS = measureGFLOPS(d)
	c.MemGBps = measureMemGBps(d)
	pc = probeCache{Version: version, Cores: c.Cores, GFLOPS: c.GFLOPS, MemGBps: c.MemGBps, ProbedAt: time.Now().UTC()}
	if b, err := json.MarshalIndent(pc, "", "  "); err == nil {
		_ = os.WriteFile(path, b, 0o600)
	}
	return c
}

// measureGFLOPS runs a blocked float32 matmul on every core for about d.
func measureGFLOPS(d time.Duration) float64 {
	const n = 64
	workers := runtime.NumCPU()
	var wg sync.WaitGroup
	counts := make([]int, workers)
	secs := make([]float64, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
			for i := range a {
				a[i], b[i] = float32(i%7)*0.1, float32(i%5)*0.2
			}
			start := time.Now()
			defer func() { secs[w] = time.Since(start).Seconds() }()
			for counts[w] < 4 || time.Since(start) < d {
				for i := 0; i < n; i++ {
					ci := c[i*n : i*n+n]
					for k := 0; k < n; k++ {
						aik := a[i*n+k]
						bk := b[k*n : k*n+n]
						for j := range ci {
							ci[j] += aik * bk[j]
						}
					}
				}
				counts[w]++
			}
		}(w)
	}
	wg.Wait()
	return round3(rate(counts, secs) * 2 * n * n * n / 1e9)
}

// measureMemGBps copies buffers larger than caches on every core; the
// figure counts bytes read plus bytes written.
func measureMemGBps(d time.Duration) float64 {
	const size = 16 << 20
	workers := runtime.NumCPU()
	var wg sync.WaitGroup
	counts := make([]int, workers)
	secs := make([]float64, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			src, dst := make([]byte, size), make([]byte, size)
			for i := range src {
				src[i] = byte(i)
			}
			copy(dst, src) // fault the pages in before timing
			start := time.Now()
			defer func() { secs[w] = time.Since(start).Seconds() }()
			for counts[w] < 2 || time.Since(start) < d {
				copy(dst, src)
				counts[w]++
			}
		}(w)
	}
	wg.Wait()
	return round3(rate(counts, secs) * 2 * size / 1e9)
}

// rate sums each worker's iterations per second.
func rate(counts []int, secs []float64) float64 {
	r := 0.0
	for i, c := range counts {
		if secs[i] > 0 {
			r += float64(c) / secs[i]
		}
	}
	return r
}

// round3 keeps three significant digits, so slow machines (or -race runs)
// still report a positive figure.
func round3(x float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 3, 64), 64)
	return v
}

// accelerator names a GPU runtime the engine could use, if any.
func accelerator() string {
	if runtime.GOOS == "darwin" && runtime.GOARCH == "arm64" {
		return "metal"
	}
	if _, err := os.Stat("/dev/nvidia0"); err == nil {
		return "cuda"
	}
	if _, err := os.Stat("/dev/kfd"); err == nil {
		return "rocm"
	}
	return ""
}
