// Package deploy holds the files that run shoal agents outside a
// developer's shell: the container image (Dockerfile, FROM scratch), a
// docker compose cluster, Kubernetes manifests (kubernetes/), a systemd
// unit with an example agent config (systemd/) and a macOS launchd job
// (launchd/). README.md says how to use each.
//
// The package holds no product code and nothing imports it: its Go tests
// parse these artifacts and check what must agree between them and the
// agent (replicas and --bootstrap-expect, the join addresses, ports,
// health probes, stop timeouts above the drain timeout, config keys the
// agent accepts), and run systemd-analyze verify when it is installed.
package deploy
