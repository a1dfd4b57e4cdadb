// Package enginetest holds the test helpers shared by the engine and the
// packages that run it: small random-weight models written with
// engine/synth, the llama.cpp logits oracle of ../shared/oracle, the
// comparison of two sets of logits by the oracle's tolerances, and the
// models that metamorphic tests run through different configurations.
//
// It is imported by tests only and must not import anything networked.
package enginetest
