// Package quant owns ggml's tensor block formats: their layout, dequantization of
// rows to float32, and quantization of float32 rows (for activations before a
// matrix product, and for writing model files).
package quant
