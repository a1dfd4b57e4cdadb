//go:build race

package vulkan

// raceEnabled is true under the race detector, where the Go reference of
// the matrix past the binding limit (127 M products) takes minutes
// instrumented; `make test` runs it.
const raceEnabled = true
