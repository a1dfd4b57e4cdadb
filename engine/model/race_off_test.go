//go:build !race

package model

const RaceEnabled = false
