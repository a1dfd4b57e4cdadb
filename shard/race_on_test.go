//go:build race

package shard

// raceOn is true under the race detector.
const raceOn = true
