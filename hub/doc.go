// Package hub owns getting models from a Hugging Face style hub onto this
// machine: resolving hub references (REPO, REPO:QUANT, REPO/FILE.gguf) to
// the files they name, downloading them with resume and sha256
// verification, and the local content-addressed model store (blobs named by
// their sha256, manifests naming models). It must not run models or know
// the cluster: the engine loads the paths it resolves, and node hands its
// byte ranges to the shard manager.
package hub
