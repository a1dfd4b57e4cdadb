# shoal — build, test, run. `make help` lists the targets.
GO        ?= go
BIN       := bin/shoal
SHARED    ?= ../shared
MODEL_DIR ?= .shoal
PKGS      := ./...
SHELL     := /bin/bash
.SHELLFLAGS := -eo pipefail -c

.PHONY: help build test test-race test-short test-integration test-faults soak test-kernels test-arm64 run bench bench-endpoint bench-json bench-cluster bench-disagg bench-gpu lint fuzz cross clean oracle

help:
	@echo "make build   build $(BIN) (CGO_ENABLED=0)"
	@echo "make run     build and start a local 3-agent cluster serving the built-in model (shoal up)"
	@echo "make test    lint, then every test (engine vs ../shared oracle when present)"
	@echo "make test-race  every package under the race detector (engine tests shrink their sizes under -race)"
	@echo "make test-integration  agents as processes in network namespaces (root; skips otherwise), the compose cluster in Docker"
	@echo "make image   the container image (deploy/Dockerfile, FROM scratch) as $(IMAGE)"
	@echo "make test-faults  4 streams through each node fault (kill -9, SIGSTOP, join, drain): what survives (root, minutes)"
	@echo "make soak    16 long streams for SOAK (10m) on 3 agents in CPU cgroups: gaps, elections, suspicions, RSS, KV (root)"
	@echo "make bench   kernel benchmarks"
	@echo "make bench-endpoint  one agent on loopback serving a small random model under 1, 4 and 16 streams"
	@echo "make bench-json  16 streams free vs held to a JSON schema (constrained decoding's cost) on the bench-endpoint model"
	@echo "make bench-cluster  a model over 1, 2 and 4 emulated devices (netns, tc tbf links, cgroup CPU quotas; root)"
	@echo "make bench-gpu  shoal bench --device vulkan beside llama.cpp's Vulkan (llama-bench -ngl 99) on the same file and device, interleaved (lavapipe here: a smoke test)"
	@echo "make bench-disagg  8 decode streams with 1,024-token prompts arriving: one device, colocated, disaggregated, auto (2 emulated devices; root)"
	@echo "make lint    gofmt, go vet (generators too), go.mod/go.sum tidy, the layout check (layout_test.go)"
	@echo "make fuzz    short fuzz runs of the parsers"
	@echo "make cross   cross-compile for darwin/arm64 and linux/arm64"
	@echo "make generate  regenerate every generated file: assembly (avo, _generate/arm64), the eBPF object (bpf2go; clang, llvm-strip), the Vulkan SPIR-V (glslc)"

build:
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -o $(BIN) ./cmd/shoal

# The oracle keeps some models as recipes; write them before the tests read them.
oracle:
	@if [ -x $(SHARED)/oracle/materialize ]; then $(SHARED)/oracle/materialize; else echo "no $(SHARED)/oracle: oracle tests will skip"; fi

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@for m in engine/*/_generate; do echo "go vet $$m"; (cd $$m && $(GO) vet ./...) || exit 1; done
	@if ! diff=$$($(GO) mod tidy -diff 2>&1); then echo "$$diff"; \
		echo "go.mod/go.sum are not tidy (or go mod tidy failed, see above): run 'go mod tidy' and commit the result"; exit 1; fi
	$(GO) test -count=1 -run 'TestTopLevelFolders|TestEveryPackageHasDoc|TestImportDirections' .

# Every .s file comes from a generator run by a //go:generate line: avo in
# engine/kernels/_generate and engine/bench/_generate for amd64,
# engine/kernels/_generate/arm64 for arm64. CI fails when the result differs
# from what is committed.
.PHONY: generate
generate:
	$(GO) generate $(PKGS)

test: lint oracle
	$(GO) test -count=1 $(PKGS)
	$(MAKE) --no-print-directory test-kernels
	@echo "== engine vs ../shared (llama.cpp logits and token ids)"
	@$(GO) test -count=1 -run 'TestOracle|TestVocabOracle' -v ./engine/model ./engine/tokenizer | grep -E 'ORACLE|passed [0-9]|SKIP|FAIL' || true

# Every package under the race detector (which also turns on checkptr).
# Tests that would take too long instrumented use smaller sizes when built
# with -race (internal/race), and allocation counts are not asserted there.
test-race:
	$(GO) test -race -count=1 -timeout 30m $(PKGS)

# Agents as separate processes in network namespaces joined by veth links.
# Needs root for ip netns; the suite skips with a message otherwise.
test-integration:
	$(GO) test -tags integration -count=1 -v -timeout 25m ./cmd/shoal/integration/
	$(GO) test -tags integration -count=1 -v -timeout 15m ./deploy/

SOAK ?= 10m
soak:
	SHOAL_SOAK=$(SOAK) SOAK_STRICT=1 $(GO) test -tags integration -count=1 -v -timeout 60m -run TestSoak ./cmd/shoal/integration/ | grep -E 'MEASURED|^(---|===|ok|FAIL|PASS)|_test.go'

# Streams through every fault of issue #21 (kill -9, SIGSTOP, join, drain)
# on agents in network namespaces; prints what survived (root). It runs in
# test-integration too; this target shows its measurements alone.
test-faults:
	$(GO) test -tags integration -count=1 -v -timeout 20m -run TestFaults ./cmd/shoal/integration/ | grep -E 'MEASURED|^(---|===|ok|FAIL|PASS)|_test.go'

# Every kernel path this machine can run, the pure-Go build, and arm64 under
# qemu-user when qemu-aarch64-static is installed (.ci/run installs it).
test-kernels:
	$(GO) test -count=1 -tags noasm ./engine/kernels/ ./engine/model/
	SHOAL_KERNELS=generic $(GO) test -count=1 ./engine/kernels/
	@if command -v qemu-aarch64-static >/dev/null; then $(MAKE) --no-print-directory test-arm64; \
	else echo "qemu-aarch64-static not installed: arm64 kernel tests skipped (apt-get install qemu-user-static)"; fi

test-arm64:
	sh engine/kernels/qemu_test.sh

test-short:
	$(GO) test -short $(PKGS)

# A local cluster of 3 agents serving the built-in model (written on first
# run); it prints the endpoint, an API key and a curl line. Ctrl-C stops it.
run: build
	$(BIN) up --nodes 3

bench:
	$(GO) test -run '^$$' -bench . -benchtime 200ms ./engine/kernels/ ./engine/quant/

# One agent on loopback serving BENCH_MODEL, measured through its
# OpenAI-compatible endpoint at each of BENCH_C concurrent streams (make -s
# bench-endpoint BENCH_ARGS=--json for JSON). The default is a random BF16
# llama (1024 wide, 8 layers, 190 MB) made with gen-model: big enough that one
# stream is bound by memory bandwidth, as real models are, so the batching of
# concurrent streams shows (a tiny model is bound by per-token overheads).
# BF16 is the float format this CPU multiplies fastest (AVX-512 BF16);
# BENCH_TYPE=f16 (or q8_0, f32...) makes another.
BENCH_TYPE  ?= bf16
BENCH_MODEL ?= $(MODEL_DIR)/bench-llama-$(BENCH_TYPE).gguf
BENCH_C     ?= 1,4,16
BENCH_N     ?= 64
bench-endpoint: build
	@if [ ! -f $(BENCH_MODEL) ]; then mkdir -p $(dir $(BENCH_MODEL)) && \
		$(BIN) gen-model --arch llama --n-embd 1024 --n-layer 8 --n-head 16 --n-head-kv 4 --n-ff 2816 --type $(BENCH_TYPE) --seed 1 -q --out $(BENCH_MODEL); fi
	BIN=$(BIN) MODEL=$(BENCH_MODEL) C=$(BENCH_C) N=$(BENCH_N) cmd/shoal/scripts/bench-endpoint.sh --ignore-eos $(BENCH_ARGS)

# Constrained decoding's cost: the bench-endpoint model at 16 streams of
# 128 tokens, free and held to a JSON schema (64 records of five typed
# fields: cmd/shoal/scripts/bench-schema.json), alternating, twice.
bench-json: build
	@if [ ! -f $(BENCH_MODEL) ]; then mkdir -p $(dir $(BENCH_MODEL)) && \
		$(BIN) gen-model --arch llama --n-embd 1024 --n-layer 8 --n-head 16 --n-head-kv 4 --n-ff 2816 --type $(BENCH_TYPE) --seed 1 -q --out $(BENCH_MODEL); fi
	BIN=$(BIN) MODEL=$(BENCH_MODEL) C=16 N=128 SCHEMA=cmd/shoal/scripts/bench-schema.json cmd/shoal/scripts/bench-endpoint.sh --requests 32 $(BENCH_ARGS)

# A TinyLlama-shaped Q4_0 llama (made on first run in $(MODEL_DIR)) spread
# over 1, 2 and 4 emulated devices: network namespaces with tc tbf links of
# 10 and 1 Gbit/s, their latency added by cmd/delayline (no netem here), and
# each agent in a cgroup v1 CPU group of 2/N cores (or SHARE each): single-
# and 8-stream decode, bytes per token, predicted against measured. Root
# only; never part of `make test`.
# BENCH_CLUSTER_ENV passes settings, e.g. BENCH_CLUSTER_ENV="QUICK=1 DEVICES='1 2'".
bench-cluster: build
	$(GO) build -o bin/delayline ./cmd/delayline
	$(GO) build -o bin/benchcoll ./cmd/benchcoll
	env BIN=$(BIN) DELAYLINE=bin/delayline BENCHCOLL=bin/benchcoll SHARED=$(SHARED) $(BENCH_CLUSTER_ENV) cmd/shoal/scripts/bench-cluster.sh

# Disaggregated serving (issue 22) on two emulated devices of 1 core each
# (netns, tc tbf links of 10 and 1 Gbit/s, cgroup v1 quotas): decode
# inter-token latency of 8 streams and the TTFT of 1,024-token prompts
# arriving periodically, for one device alone, a colocated shared pool, a
# prefill-pinned device with --disagg on and with --disagg auto, and the
# KV bytes on the wire per prompt token. Root only; about 20 minutes
# (BENCH_DISAGG_ENV="QUICK=1": a small model, a few minutes).
bench-disagg: build
	env BIN=$(BIN) SHARED=$(SHARED) $(BENCH_DISAGG_ENV) cmd/shoal/scripts/bench-disagg.sh

# shoal's Vulkan backend beside llama.cpp's (llama-bench -ngl 99, from
# $(SHARED)/tools/llama-oracle) on the same file and device, interleaved.
bench-gpu: build
	env BIN=$(BIN) SHARED=$(SHARED) cmd/shoal/scripts/bench-gpu.sh

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 30s ./engine/gguf/
	$(GO) test -run '^$$' -fuzz FuzzEncode -fuzztime 30s ./engine/tokenizer/
	$(GO) test -run '^$$' -fuzz FuzzFSMCommands -fuzztime 60s ./coordinator/
	$(GO) test -run '^$$' -fuzz FuzzPlanner -fuzztime 60s ./placement/

cross:
	CGO_ENABLED=0 GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./cmd/shoal
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./cmd/shoal

clean:
	rm -rf bin $(MODEL_DIR)

# The container image (deploy/Dockerfile, FROM scratch): the static binary
# and the folders it owns; no base image is pulled.
IMAGE ?= shoal:latest
.PHONY: image
image:
	rm -rf deploy/.image && mkdir -p deploy/.image/rootfs/data deploy/.image/rootfs/models
	mkdir -m 1777 deploy/.image/rootfs/tmp
	CGO_ENABLED=0 $(GO) build -buildvcs=auto -tags novulkan -trimpath -ldflags='-s -w' -o deploy/.image/shoal ./cmd/shoal
	docker build -f deploy/Dockerfile -t $(IMAGE) deploy/.image
	@docker image inspect $(IMAGE) --format 'image {{index .RepoTags 0}}: {{.Size}} bytes'
