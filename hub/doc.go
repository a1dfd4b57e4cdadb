// Package hub owns getting models from a Hugging Face style hub onto this
// machine: resolving hub references (REPO, REPO:QUANT, REPO/FILE.gguf) to
// the files they name, downloading them with resume and sha256
// verification, and the local content-addressed model store (blobs named by
// their sha256, manifests naming models), and reading a file's byte ranges
// in place (Resolve, ReadRange: HTTP Range requests that resume a cut
// connection) for a cluster whose nodes each read only their shards'
// ranges. It must not run models or know
// the cluster: the engine loads the paths it resolves, and node hands its
// byte ranges to the shard manager.
package hub
