#!/usr/bin/env bash
# A 3-agent cluster on loopback, one agent with a Vulkan GPU (--device
# vulkan:DEVICE; lavapipe here) and two on the CPU: loads MODEL on the GPU
# agent alone and as a 3-stage pipeline over all three, prints each plan as
# `shoal placement show` gives it (the GPU's layers, the predicted ms/token
# from the measured rates) and what `shoal bench --cluster` measures for it,
# and the ratio of the two.
#
#   cmd/shoal/scripts/gpu-plan.sh
#
# Environment: BIN (default bin/shoal), MODEL (default a generated 8-layer
# Q8_0 llama of n_embd 1024, .shoal/gpu-plan-q8_0.gguf: Q8_0 is the format
# the agent measures its GPU's decode rate with), DEVICE (default 0), GEN
# (tokens per decode run, default 16), REPS (default 3), BASE_PORT (default
# 27940). On one host the three agents share its cores: the GPU agent starts
# last, after the others' probes, so that its measurement has the host.
set -euo pipefail

BIN=${BIN:-bin/shoal}
DEVICE=${DEVICE:-0}
GEN=${GEN:-16}
REPS=${REPS:-3}
BASE_PORT=${BASE_PORT:-27940}
MODEL=${MODEL:-.shoal/gpu-plan-q8_0.gguf}
[ -x "$BIN" ] || { echo "gpu-plan: $BIN not built (make build)" >&2; exit 1; }
if [ ! -f "$MODEL" ]; then
	mkdir -p "$(dirname "$MODEL")"
	"$BIN" gen-model --arch llama --n-embd 1024 --n-layer 8 --n-head 16 --n-head-kv 4 --n-ff 2816 --type q8_0 --seed 36 --out "$MODEL" >&2
fi
model_abs=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")

work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-gpu-plan.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

secret=gpu-plan-bootstrap-secret
names=(cpu1 cpu2 gpu)
devices=(cpu cpu "vulkan:$DEVICE")
joins=()
for i in 0 1 2; do joins+=(--join "127.0.0.1:$((BASE_PORT + 10 * i + 1))"); done
for i in 0 1 2; do
	p=$((BASE_PORT + 10 * i))
	"$BIN" agent --server --bootstrap-expect 3 --token "$secret" --name "${names[$i]}" --data-dir "$work/${names[$i]}" \
		--bind 127.0.0.1 --gossip-port "$p" --quic-port $((p + 1)) --http-port $((p + 2)) --device "${devices[$i]}" \
		"${joins[@]}" --log-level warn >"$work/${names[$i]}.log" 2>&1 &
	pids+=($!)
	[ "$i" = 1 ] && sleep 3 # the CPU agents' probes done before the GPU agent measures
done
export SHOAL_ADDR=127.0.0.1:$((BASE_PORT + 2)) SHOAL_TOKEN=$secret
for _ in $(seq 600); do
	"$BIN" node ls -o json 2>/dev/null | grep -q '"gpu_gbps"' && break
	sleep 0.1
done
"$BIN" node ls -o json | grep -q '"gpu_gbps"' || { echo "gpu-plan: the GPU agent did not join:" >&2; cat "$work"/*.log >&2; exit 1; }
grep -h '^device:' "$work"/*.log >&2 || true
"$BIN" node ls

run() {
	local name=$1; shift
	"$BIN" model load "$model_abs" --name "$name" --ctx 256 "$@" >/dev/null
	for _ in $(seq 1200); do
		"$BIN" model ls -o json | grep -q "\"name\": *\"$name\"[^}]*\"status\": *\"ready\"" && break
		sleep 0.1
	done
	echo
	"$BIN" placement show "$name"
	echo
	"$BIN" bench --cluster "$SHOAL_ADDR" --token "$secret" --model "$name" -p 16 -n "$GEN" -r "$REPS" --json >"$work/$name.json"
	python3 - "$work/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["results"]:
    if x["test"].startswith("tg"):
        pred = r["predicted_ms_per_token"]
        print(f"{r['model']}: predicted {pred:.1f} ms/token, measured {x['ms_per_token']:.1f} ms/token "
              f"({x['tok_per_sec']:.2f} tok/s): measured/predicted {x['ms_per_token']/pred:.2f}")
PY
	"$BIN" model unload "$name" >/dev/null
}
run gpu-alone --nodes gpu
run pipeline3 --nodes gpu,cpu1,cpu2 --strategy pipeline
