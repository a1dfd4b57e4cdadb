// Package catalog is the cluster's models and their files, as one node
// takes part in them: registering a model by the path of a GGUF file on a
// node (profiled, hashed in the background, its manifest kept) or by hub
// reference (read in place, checked once its nodes hold their ranges, the
// check taken over by the leader when the loading agent is gone); the
// registry of the model files this node has, served to peers over the
// Weights RPCs (signed layouts, holdings) and the weights stream; and the
// whole-file copies a node makes so that a model's file is not on one node
// only. It reads and writes the state through a small Deps the agent (node)
// fills in.
//
// It must not decide placement or which nodes copy a file: the
// coordinator's pure functions of the state do (coordinator.CopyChosen,
// coordinator.WholeHolders, coordinator.ModelStatus); catalog acts on
// their answers.
package catalog
