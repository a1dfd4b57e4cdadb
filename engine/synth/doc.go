// Package synth writes deterministic random-weight GGUF models of the
// architectures shoal runs, for tests, benchmarks and the built-in default
// model. Weights are a pure function of the shapes, the seed and the tensor
// name; quantization uses shoal's own quantizers.
package synth
