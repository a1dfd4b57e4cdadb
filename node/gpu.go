package node

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"shoal/engine/device/vulkan"
	"shoal/engine/device/vulkan/vk"
)

// gpuCaps adds the chosen GPU to the node's capabilities: its name, the
// memory layers may take there (what Fit gives them), and its decode rate
// measured for about d.
func (a *Agent) gpuCaps(d time.Duration) error {
	f, ok := a.dev.(vulkan.Fit)
	if !ok {
		return nil
	}
	info := f.GPU.Info()
	gbps := a.cfg.Tuning.GPUGBps
	if gbps <= 0 {
		var err error
		if gbps, err = f.GPU.MeasureGBps(d); err != nil {
			return fmt.Errorf("measuring %s: %w", info.Name, err)
		}
	}
	name := info.Name
	if len(name) > 48 {
		name = name[:48]
	}
	a.caps.GPU, a.caps.GPUMem, a.caps.GPUGBps = name, info.Memory/10*9, round3(gbps)
	a.caps.GPUShared = info.Type == vk.DeviceIntegrated || info.Type == vk.DeviceCPU
	a.log.Info("gpu", zap.String("name", info.Name), zap.String("type", info.TypeName()), zap.Uint64("mem_mib", a.caps.GPUMem>>20), zap.Float64("gb_s", a.caps.GPUGBps))
	return nil
}

// round3 keeps three significant decimals of a measured rate.
func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }
