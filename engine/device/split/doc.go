// Package split is a device made of two: the first layers of a range on
// one device (a GPU, as many layers as its memory holds) and the rest on
// another (the CPU), what llama.cpp users know as -ngl. The hidden states
// cross between the two on the host; each part keeps its own KV rows. It
// must not know which devices it joins.
package split
