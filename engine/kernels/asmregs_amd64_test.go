//go:build amd64 && !noasm && gc

package kernels

import (
	"os"
	"regexp"
	"testing"
)

// The AVX2 kernels must not touch the AVX-512 registers (X16-X31, Y16-Y31,
// Z*, K*): avo's allocator may pick them under register pressure.
func TestAsmNoAVX512Registers(t *testing.T) {
	src, err := os.ReadFile("dot_amd64.s")
	if err != nil {
		t.Skip(err)
	}
	re := regexp.MustCompile(`\b([XY](1[6-9]|2[0-9]|3[01])|Z[0-9]+|K[1-7])\b`)
	if m := re.FindAllIndex(src, 3); m != nil {
		for _, l := range m {
			t.Errorf("AVX-512 register %s at byte %d of dot_amd64.s", src[l[0]:l[1]], l[0])
		}
	}
}
