//go:build arm64 && !noasm && gc

package kernels

import (
	"reflect"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"

	"shoal/engine/quant"
)

func expectedLevel() string {
	if cpu.ARM64.HasASIMDDP {
		return "neon-dot"
	}
	return "neon"
}

// Each NEON level runs its own kernels: the integer formats the SDOT ones
// under neon-dot and the SMULL/SADALP ones under neon, F16 the same kernel
// in both.
func TestArm64Kernels(t *testing.T) {
	eachLevel(t, func(level string) {
		if level == "generic" {
			return
		}
		suffix := map[string]string{"neon": "NEON", "neon-dot": "SDOT"}[level]
		for typ, want := range map[quant.Type]string{
			quant.Q8_0: "dotQ8_0" + suffix, quant.Q4_0: "dotQ4_0" + suffix,
			quant.Q4_K: "dotQ4_K" + suffix, quant.Q6_K: "dotQ6_K" + suffix,
			quant.F16: "dotF16NEON",
		} {
			ks := kernelsFor(typ)
			if ks == nil {
				t.Errorf("%s: no kernel for %v", level, typ)
				continue
			}
			for _, k := range []struct {
				f    any
				want string
			}{{ks.rows, want}, {ks.one, "one" + strings.TrimPrefix(want, "dot")}} {
				name := runtime.FuncForPC(reflect.ValueOf(k.f).Pointer()).Name()
				if !strings.HasSuffix(name, "."+k.want) {
					t.Errorf("%s %v: kernel %s, want %s", level, typ, name, k.want)
				}
			}
		}
	})
}
