#!/usr/bin/env bash
# Start one shoal agent on loopback serving MODEL, run `shoal bench-endpoint`
# against its OpenAI-compatible endpoint, and stop the agent.
#
#   cmd/shoal/scripts/bench-endpoint.sh [extra bench-endpoint flags, e.g. --json]
#
# Environment: BIN (default bin/shoal), MODEL (default
# .shoal/bench-llama-bf16.gguf, made by `make bench-endpoint`), C (levels,
# default 1,4,16), N (max_tokens, default 64), THREADS (engine threads,
# default all cores), MAX_SEQS (sequences decoded together, default 16),
# CPUPROFILE (write the agent's Go CPU profile to this file), NO_PREFIX_CACHE=1
# (compute every prompt in full: the agent's --no-prefix-cache), SCHEMA (a
# JSON Schema file: run each level twice over, without and with
# response_format json_schema, alternating, to compare constrained decoding).
set -euo pipefail

BIN=${BIN:-bin/shoal}
MODEL=${MODEL:-.shoal/bench-llama-bf16.gguf}
C=${C:-1,4,16}
N=${N:-64}
MAX_SEQS=${MAX_SEQS:-16}

[ -x "$BIN" ] || { echo "bench-endpoint: $BIN not built (make build)" >&2; exit 1; }
"$BIN" bench-endpoint --help >/dev/null 2>&1 || {
	echo "bench-endpoint: $BIN has no bench-endpoint command (register benchEndpointCmd() in cmd/shoal/main.go)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "bench-endpoint: no model at $MODEL (make bench-endpoint makes one)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench.XXXXXX")
log=$work/agent.log
agent=""
cleanup() {
	if [ -n "$agent" ] && kill -0 "$agent" 2>/dev/null; then
		kill -TERM "$agent" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$agent" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$agent" 2>/dev/null || true
		wait "$agent" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Port 0 everywhere: the agent picks free ports and prints its API address.
args=(agent --server --bootstrap-expect 1 --name bench --data-dir "$work/data" --bind 127.0.0.1
	--gossip-port 0 --quic-port 0 --http-port 0 --model "$MODEL" --max-seqs "$MAX_SEQS" --log-level warn)
[ -n "${THREADS:-}" ] && args+=(--threads "$THREADS")
[ -n "${CPUPROFILE:-}" ] && args+=(--cpuprofile "$CPUPROFILE")
[ "${NO_PREFIX_CACHE:-}" = 1 ] && args+=(--no-prefix-cache)
"$BIN" "${args[@]}" >"$log" 2>&1 &
agent=$!

addr=""
for _ in $(seq 300); do
	kill -0 "$agent" 2>/dev/null || { echo "bench-endpoint: the agent exited:" >&2; cat "$log" >&2; exit 1; }
	addr=$(sed -n 's/.* api http:\/\/\([^ ]*\).*/\1/p' "$log" | head -n1)
	[ -n "$addr" ] && [ -s "$work/data/bootstrap-token" ] && break
	sleep 0.1
done
[ -n "$addr" ] || { echo "bench-endpoint: the agent did not start in 30 s:" >&2; cat "$log" >&2; exit 1; }
token=$(cat "$work/data/bootstrap-token")

# Ready when the model is listed.
ready=""
for _ in $(seq 300); do
	if "$BIN" bench-endpoint --endpoint "http://$addr" --token "$token" -c 1 -n 1 --requests 1 --warmup 0 >/dev/null 2>&1; then
		ready=1
		break
	fi
	sleep 0.1
done
[ -n "$ready" ] || { echo "bench-endpoint: the agent at $addr does not answer completions:" >&2; cat "$log" >&2; exit 1; }

echo "agent at http://$addr serving $MODEL ($(nproc 2>/dev/null || echo ?) cores)" >&2
if [ -n "${SCHEMA:-}" ]; then
	for round in 1 2; do
		for mode in free schema; do
			extra=()
			[ "$mode" = schema ] && extra=(--json-schema "$SCHEMA")
			echo "== $mode output, round $round" >&2
			"$BIN" bench-endpoint --endpoint "http://$addr" --token "$token" -c "$C" -n "$N" "${extra[@]}" "$@"
		done
	done
	exit 0
fi
"$BIN" bench-endpoint --endpoint "http://$addr" --token "$token" -c "$C" -n "$N" "$@"
