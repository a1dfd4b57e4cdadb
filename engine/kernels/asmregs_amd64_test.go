//go:build amd64 && !noasm && gc

package kernels

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The AVX2 kernels must not touch the AVX-512 registers (X16-X31, Y16-Y31,
// Z*, K*): avo's allocator may pick them under register pressure. Only the
// AVX-512 kernels (named dot<type>V<R>C<C>, with T0 for the L1-prefetching
// variants; file-local symbols, dot...<>, as every matrix kernel) may, and
// they run only on CPUs that have it.
func TestAsmNoAVX512Registers(t *testing.T) {
	src, err := os.ReadFile("dot_amd64.s")
	if err != nil {
		t.Skip(err)
	}
	re := regexp.MustCompile(`\b([XY](1[6-9]|2[0-9]|3[01])|Z[0-9]+|K[1-7])\b`)
	avx512 := regexp.MustCompile(`^TEXT dot\w+V\dC\d+(T0)?<>\(SB\)`)
	seen := 0
	for _, fn := range strings.Split(string(src), "\n// func ")[1:] {
		i := strings.Index(fn, "\nTEXT ")
		if i < 0 {
			continue
		}
		text := fn[i+1:]
		if avx512.MatchString(text) {
			seen++
			continue
		}
		if m := re.FindString(text); m != "" {
			t.Errorf("AVX-512 register %s in the AVX2 kernel %s", m, text[:strings.Index(text, "(SB)")])
		}
	}
	if seen == 0 {
		t.Error("no AVX-512 kernels found in dot_amd64.s")
	}
}
