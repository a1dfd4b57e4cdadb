#!/bin/bash
# measure.sh TEMPLATE_DIR MODEL.gguf: writes llama.cpp's prompt for each template of
# sources.json and each conversation of conversations/ to llama/TEMPLATE.CONVERSATION.txt
# (llama/TEMPLATE.CONVERSATION.error, the exception, when llama.cpp refuses it), from llama-server's
# /apply-template with --jinja --chat-template-file. MODEL's vocabulary gives bos_token and
# eos_token (sources.json's bos and eos). Run from this folder; LLAMA_ORACLE is the
# llama-oracle run script (default: the repository's ../shared/tools/llama-oracle/run).
set -euo pipefail
tdir=$(realpath "$1"); model=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
run=${LLAMA_ORACLE:-$here/../../../../../shared/tools/llama-oracle/run}
port=${PORT:-18437}
cd "$here"
mkdir -p llama
for file in $(python3 -c 'import json; print(" ".join(t["file"] for t in json.load(open("sources.json"))["templates"]))'); do
  "$run" llama-server -m "$model" --jinja --chat-template-file "$tdir/$file" --host 127.0.0.1 --port "$port" -c 256 -t 1 -np 1 >"${TMPDIR:-/tmp}/measure-$port.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -sf "127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
  for conv in conversations/*.json; do
    name=${file%.jinja}.$(basename "$conv" .json)
    curl -s "127.0.0.1:$port/apply-template" -d @"$conv" | python3 -c '
import json, sys
d = json.load(sys.stdin)
name = sys.argv[1]
if "prompt" in d:
    open(name + ".txt", "w", newline="").write(d["prompt"])
else:
    # the exception only: the message goes on to quote the template
    open(name + ".error", "w").write(d["error"]["message"].strip().splitlines()[-1] + "\n")
' "llama/$name"
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
  for _ in $(seq 50); do curl -sf "127.0.0.1:$port/health" >/dev/null || break; sleep 0.2; done
done
