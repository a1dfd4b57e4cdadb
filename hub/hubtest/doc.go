// Package hubtest is a fake Hugging Face hub for tests: the tree listing
// and resolve endpoints the hub package uses, a CDN to redirect to, Range
// requests, one-shot connection cuts, gated repositories, wrong checksums
// and counters of the bytes it served. It must not be imported by product
// code.
package hubtest
