//go:build race

package kernels

// raceEnabled is true under the race detector. There sync.Pool drops items
// at random, so the no-allocation checks do not hold, and the Go code runs
// many times slower instrumented, so the shape sweeps take their -short
// lists: the race run is there for the pool's concurrency, and `make test`
// covers every shape.
const raceEnabled = true
