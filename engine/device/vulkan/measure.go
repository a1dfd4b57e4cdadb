package vulkan

import (
	"encoding/binary"
	"sort"
	"time"

	"shoal/engine/device/vulkan/vk"
	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// MeasureGBps streams Q8_0 matrices larger than any cache through the
// decode mat-vec kernel for about d (at least 4 passes over them) and
// returns the weight bytes read per second of the fastest pass, in GB/s:
// the rate a decode step reads the device's memory at. The fastest pass,
// not the mean: an agent measures at start-up, beside the other agents'
// probes on a shared host, and on lavapipe beside its own CPU's work, so
// a slow pass measures the moment, not the device (as a link's estimate
// is the best of its last probes).
func (g *GPU) MeasureGBps(d time.Duration) (float64, error) {
	const rows, cols, mats = 4096, 4096, 4 // 4 × 17.8 MB
	rs := quant.Q8_0.RowSize(cols)
	data := make([]byte, rows*rs)
	for b := 0; b < len(data); b += 34 {
		binary.LittleEndian.PutUint16(data[b:], quant.FP32ToFP16(0.01))
	}
	m, err := kernels.NewMatrix(quant.Q8_0, rows, cols, data)
	if err != nil {
		return 0, err
	}
	var ms []*Matrix
	defer func() {
		for _, x := range ms {
			x.Free()
		}
	}()
	for range mats {
		dm, err := g.Upload(m)
		if err != nil {
			return 0, err
		}
		ms = append(ms, dm)
	}
	x, err := g.floats(make([]float32, cols))
	if err != nil {
		return 0, err
	}
	defer x.Free()
	y, err := g.floats(make([]float32, rows))
	if err != nil {
		return 0, err
	}
	defer y.Free()
	pass := func() error {
		cmd := g.ctx.Begin()
		for _, dm := range ms {
			dm.MatVec(cmd, Vec{B: x, Stride: cols}, 1, Vec{B: y, Stride: rows})
		}
		return cmd.Submit()
	}
	if err := pass(); err != nil { // warm up
		return 0, err
	}
	// at least 4 passes: on a slow device (lavapipe) one pass is a large
	// part of d, and 2 passes measured 40% low beside agents starting
	start, best := time.Now(), time.Duration(0)
	for k := 0; k < 4 || time.Since(start) < d; k++ {
		t0 := time.Now()
		if err := pass(); err != nil {
			return 0, err
		}
		if took := time.Since(t0); best == 0 || took < best {
			best = took
		}
	}
	return float64(mats*len(data)) / best.Seconds() / 1e9, nil
}

// SubmitOverhead is the median time of a submit and fence wait of a
// command buffer holding one tiny dispatch: what every step on the device
// pays besides its arithmetic.
func (g *GPU) SubmitOverhead(n int) (time.Duration, error) {
	k, err := g.kernel("silumul", 2, 4)
	if err != nil {
		return 0, err
	}
	b, err := g.floats(make([]float32, 64))
	if err != nil {
		return 0, err
	}
	defer b.Free()
	ts := make([]time.Duration, 0, n)
	for range max(n, 1) {
		t0 := time.Now()
		cmd := g.ctx.Begin()
		cmd.Dispatch(k, 1, 1, 1, []uint32{64}, vk.Whole(b), vk.Whole(b))
		if err := cmd.Submit(); err != nil {
			return 0, err
		}
		ts = append(ts, time.Since(t0))
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	return ts[len(ts)/2], nil
}
