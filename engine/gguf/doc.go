// Package gguf reads and writes GGUF model files (versions 2 and 3).
//
// The reader maps the file into memory and hands out tensor data as
// zero-copy views. Every count, size and offset in the header is checked
// against the file before it is used, so a corrupt or truncated file gives an
// error that names the offset and what was wrong, never a panic or a huge
// allocation.
package gguf
