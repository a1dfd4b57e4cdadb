#!/usr/bin/env bash
# shoal's Vulkan backend beside llama.cpp's Vulkan backend on the same GGUF
# file and the same device, in interleaved rounds: `shoal bench --device
# vulkan:N` and `llama-bench -ngl 99` (llama.cpp 0.7.0 from
# ../shared/tools/llama-oracle). Prints prefill and decode tok/s of each
# round, the medians, their ratio, and decode as effective GB/s against the
# device's rate shoal measured.
#
#   cmd/shoal/scripts/bench-gpu.sh
#
# Environment: BIN (default bin/shoal), MODEL (default a generated 8-layer
# Q4_K_M llama of n_embd 1024, written to .shoal/bench-gpu-q4_k_m.gguf),
# DEVICE (Vulkan device index, default 0), PP (prompt size, default 64),
# TG (tokens generated, default 32), REPS (runs per round, default 2), ROUNDS
# (default 3), SHARED (default ../shared), THREADS (CPU threads of both,
# default 2). On lavapipe (a Vulkan driver on the CPU) the ratio is a smoke
# test of the shaders, not a speed: name a real GPU's index where there is one.
set -euo pipefail

BIN=${BIN:-bin/shoal}
SHARED=${SHARED:-../shared}
DEVICE=${DEVICE:-0}
PP=${PP:-64}
TG=${TG:-32}
REPS=${REPS:-2}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
MODEL=${MODEL:-.shoal/bench-gpu-q4_k_m.gguf}
ORACLE=$SHARED/tools/llama-oracle

[ -x "$BIN" ] || { echo "bench-gpu: $BIN not built (make build)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-gpu: python3 reads the JSON results" >&2; exit 1; }
if [ ! -f "$MODEL" ]; then
	mkdir -p "$(dirname "$MODEL")"
	"$BIN" gen-model --arch llama --n-embd 1024 --n-layer 8 --n-head 16 --n-head-kv 4 --n-ff 2816 --type q4_k_m --seed 36 --out "$MODEL" >&2
fi
llama=1
if [ ! -x "$ORACLE/run" ]; then
	echo "bench-gpu: no $ORACLE: shoal's numbers only" >&2; llama=0
elif ! "$ORACLE/run" true 2>/dev/null; then
	echo "bench-gpu: $ORACLE is not set up ($ORACLE/setup, root): shoal's numbers only" >&2; llama=0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench-gpu.XXXXXX")
trap 'rm -rf "$work"' EXIT
model_abs=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")
for r in $(seq "$ROUNDS"); do
	echo "round $r/$ROUNDS: shoal" >&2
	"$BIN" bench --model "$MODEL" --device "vulkan:$DEVICE" -t "$THREADS" -p "$PP" -n "$TG" -r "$REPS" --json >"$work/shoal-$r.json"
	if [ "$llama" = 1 ]; then
		echo "round $r/$ROUNDS: llama.cpp" >&2
		"$ORACLE/run" env GGML_VK_VISIBLE_DEVICES="$DEVICE" llama-bench -m "$model_abs" -ngl 99 -t "$THREADS" \
			-p "$PP" -n "$TG" -r "$REPS" -o json >"$work/llama-$r.json" 2>"$work/llama-$r.err" ||
			{ cat "$work/llama-$r.err" >&2; exit 1; }
	fi
done

python3 - "$work" "$ROUNDS" "$PP" "$TG" "$llama" <<'PY'
import json, statistics, sys
work, rounds, pp, tg, llama = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
shoal = {"pp": [], "tg": []}
ll = {"pp": [], "tg": []}
info = None
for r in range(1, rounds + 1):
    s = json.load(open(f"{work}/shoal-{r}.json"))
    info = s
    for res in s["results"]:
        shoal[res["test"][:2]].append(res["tok_per_sec"])
    if llama:
        for res in json.load(open(f"{work}/llama-{r}.json")):
            key = "pp" if res["n_prompt"] > 0 else "tg"
            ll[key].append(res["avg_ts"])
gpu = info.get("gpu") or {}
bpt = info["bytes_per_token"]
print(f"model: {info['model']} ({info['arch']}, {info['model_bytes']/2**20:.1f} MiB, {bpt} bytes read per token)")
print(f"device: {info['device']}")
print(f"cpu: {info['cpu']} ({info['cores']} cores)\n")
print("| test | round | shoal t/s | llama.cpp t/s | shoal/llama.cpp |")
print("| --- | ---: | ---: | ---: | ---: |")
for key, name in (("pp", f"pp{pp}"), ("tg", f"tg{tg}")):
    for i, v in enumerate(shoal[key]):
        o = ll[key][i] if llama and i < len(ll[key]) else None
        print(f"| {name} | {i+1} | {v:.2f} | {o:.2f} | {v/o:.2f}x |" if o else f"| {name} | {i+1} | {v:.2f} | - | - |")
    ms = statistics.median(shoal[key])
    if llama and ll[key]:
        ml = statistics.median(ll[key])
        print(f"| {name} | median | {ms:.2f} | {ml:.2f} | {ms/ml:.2f}x |")
    else:
        print(f"| {name} | median | {ms:.2f} | - | - |")
tgm = statistics.median(shoal["tg"])
eff = tgm * bpt / 1e9
line = f"\ndecode: {eff:.2f} GB/s of weights read (shoal)"
if gpu.get("gb_s"):
    line += f", {100*eff/gpu['gb_s']:.0f}% of the {gpu['gb_s']:.2f} GB/s shoal's mat-vec measured on {gpu['name']}"
if llama and ll["tg"]:
    line += f"; llama.cpp {statistics.median(ll['tg'])*bpt/1e9:.2f} GB/s"
print(line)
print(f"submit and fence per step: {gpu.get('submit_us', '?')} µs")
PY
