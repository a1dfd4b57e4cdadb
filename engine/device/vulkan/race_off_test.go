//go:build !race

package vulkan

const raceEnabled = false
