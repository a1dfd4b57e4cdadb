// Package placementtest builds, from a model's shape, the plans that tests
// run a model through: pipeline stages, tensor-parallel groups (uneven
// heads, FFN cuts on and off block boundaries) and expert-parallel
// members. It is imported by tests only; it must not do I/O or hold
// planning policy (that is placement's).
package placementtest
