package bench

import (
	"bufio"
	"os"
	"runtime"
	"strings"
)

// CPUName describes the processor the numbers were measured on, so that
// results from different machine types are not compared as if alike: the
// "model name" of /proc/cpuinfo on Linux, else the architecture.
func CPUName() string {
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && strings.TrimSpace(k) == "model name" {
				if v = strings.TrimSpace(v); v != "" {
					return v
				}
			}
		}
	}
	return runtime.GOOS + "/" + runtime.GOARCH
}
