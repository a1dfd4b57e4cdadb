#!/bin/sh
# Runs the kernel tests for arm64 under qemu-user: once with the dot-product
# extension (QEMU_CPU=max: neon-dot, neon, generic) and once without
# (QEMU_CPU=cortex-a53: neon, generic). Needs qemu-user-static
# (apt-get install qemu-user-static). Usage, from the repository root:
#	sh engine/kernels/qemu_test.sh [extra go test flags]
set -e
cd "$(dirname "$0")"
for cpu in max cortex-a53; do
	echo "== QEMU_CPU=$cpu"
	QEMU_CPU=$cpu GOARCH=arm64 go test -count=1 -short -exec qemu-aarch64-static "$@" .
done
