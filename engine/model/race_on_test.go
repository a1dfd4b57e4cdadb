//go:build race

package model

// RaceEnabled (exported for the model_test package) is true under the race
// detector, where sync.Pool drops items at random, so the no-allocation
// checks do not hold.
const RaceEnabled = true
