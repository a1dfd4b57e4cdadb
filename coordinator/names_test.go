package coordinator

import (
	"strings"
	"testing"
)

func TestCheckNodeName(t *testing.T) {
	for _, ok := range []string{"n0", "node-1", "gpu_box.lan", "A", strings.Repeat("a", MaxNodeNameLen)} {
		if err := CheckNodeName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-lead", ".hidden", "a b", "node\x1b[31m", "x\ny", "a/b", "q\"", "ü", strings.Repeat("a", MaxNodeNameLen+1)} {
		if err := CheckNodeName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
