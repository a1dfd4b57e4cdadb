#!/usr/bin/env bash
# Compiles the compute shaders to the SPIR-V the package embeds (spv/).
# Run by `go generate` (make generate) from the package folder; needs glslc
# (Debian: apt-get install glslc). CI checks the result equals what is
# committed, so the same glslc must give the same bytes.
set -euo pipefail
cd "$(dirname "$0")"
command -v glslc >/dev/null || { echo "glslc is needed to compile the shaders (apt-get install glslc)" >&2; exit 1; }
out=../spv
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
cc() { glslc -O --target-env=vulkan1.1 -Werror "$@"; }
for f in F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K IQ4_XS; do
  cc -DFMT_$f -o "$out.tmp/matvec_$(echo $f | tr A-Z a-z).spv" matvec.comp
  cc -DFMT_$f -o "$out.tmp/matmul_$(echo $f | tr A-Z a-z).spv" matmul.comp
done
for s in *.comp; do
  case $s in matvec.comp | matmul.comp) continue ;; esac
  cc -o "$out.tmp/${s%.comp}.spv" "$s"
done
rm -rf "$out" && mv "$out.tmp" "$out"
