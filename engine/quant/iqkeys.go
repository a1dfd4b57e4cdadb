package quant

import (
	"embed"
	"fmt"
	"strconv"
	"strings"
)

// The codebook keys of the IQ formats (iq1grid.go, iq2grid.go and
// iq3grid.go say what they are) are data: iqkeys/*.txt hold them in
// decimal, in increasing order, sixteen a line, and the package reads them
// once, when it is initialised.
//
//go:embed iqkeys/*.txt
var iqKeyFiles embed.FS

// iqKeys reads the n keys of iqkeys/name; it panics unless the file holds
// exactly n numbers that fit in 16 bits (a broken build, caught by any
// test of the package).
func iqKeys(name string, n int) []uint16 {
	text, err := iqKeyFiles.ReadFile("iqkeys/" + name)
	if err != nil {
		panic(err)
	}
	fields := strings.Fields(string(text))
	if len(fields) != n {
		panic(fmt.Sprintf("quant: iqkeys/%s holds %d keys, want %d", name, len(fields), n))
	}
	keys := make([]uint16, n)
	for i, f := range fields {
		k, err := strconv.ParseUint(f, 10, 16)
		if err != nil {
			panic(fmt.Sprintf("quant: iqkeys/%s key %d: %v", name, i, err))
		}
		keys[i] = uint16(k)
	}
	return keys
}
