#!/usr/bin/env bash
# Benchmark a model spread over emulated devices on this machine.
#
# Each device is a network namespace joined by a veth pair to a hub
# namespace that routes between them; every veth end is shaped with a token
# bucket (tc tbf) to the link rate, and each device's agent runs in its own
# cgroup v1 CPU group with a quota of CORES/N cores (N devices share CORES
# cores; one device gets all CORES), or SHARE cores each. For every link
# rate and device count the script starts N agents, loads MODEL with each
# strategy, waits until it is served, runs `shoal bench --cluster` (prefill
# of each PROMPT size and single-stream decode) on the driver, then loads it again for 8
# sequences and runs 8 streams at once (`shoal bench-endpoint`, from the hub
# namespace, outside every quota). It prints a table: devices, link, plan,
# single-stream decode and prompt tok/s, the 8-stream aggregate, bytes on
# the wire per token, the planner's predicted ms/token beside the measured
# one (for 1 and for 8 sequences a step), its predicted breakdown, and the
# memory bandwidth each device measured of itself.
#
# Latency: this kernel has no netem qdisc, so the hub routes every packet
# through cmd/delayline, which holds it for the link's one-way latency
# (LATENCY; by default 50 us for 10gbit and 150 us for 1gbit: round trips
# of about 0.1 and 0.3 ms, plus the line's own ~0.1 ms). The line is a
# userspace relay: it carries about 1.7 Gbit/s on this machine, a limit
# of its own on the 10gbit rows (decode moves far less).
#
#   sudo cmd/shoal/scripts/bench-cluster.sh            # or: make bench-cluster
#
# Environment:
#   BIN        shoal binary (bin/shoal)
#   MODEL      GGUF file (default .shoal/bench-tinyllama-q4_0.gguf: a random
#              llama with TinyLlama-1.1B's shapes in Q4_0, made if missing)
#   QUICK=1    use a small model instead (.shoal/bench-small-q4_0.gguf)
#   DEVICES    device counts (default "1 2 4")
#   LINKS      link rates (default "10gbit 1gbit")
#   STRATEGIES plans tried for N > 1 (default "auto pipeline tensor
#              auto+prompt pipeline+prompt"; auto lets the planner choose;
#              +prompt loads with --plan-prompt PLAN_PROMPT: stages balanced
#              for prefill, the plan chosen by predicted time to first token)
#   PLAN_PROMPT  the prompt length +prompt plans for (default: the longest
#              of PROMPT)
#   CORES      cores shared by the devices (default 2)
#   SHARE      cores per device, the same for every device count (e.g. 1, or
#              0.5), so N devices are compared with one device of the same
#              size; default: CORES/N (N devices split CORES, one gets all)
#   PERIOD_US  CFS period of the quota (default 100000; a shorter one makes
#              a fractional share less bursty)
#   PROMPT     prompt sizes of the prefill table, comma-separated (default
#              512,2048: one step each, pipelined in pieces through the stages)
#   GEN, REPS  decode length and runs of each test (default 64, 3)
#   CTX        context the plan reserves (default 2304: the longest prompt)
#   LATENCY    one-way latency per link rate (default "10gbit=50us
#              1gbit=150us"; "none": no delay line)
#   DELAYLINE  the delay line binary (bin/delayline)
#   DELAYLINE_SPIN  its --spin: the end of each wait spent polling instead of
#              sleeping, which a timer's late wake-up (40-50 us on a virtual
#              machine) would add to every packet, at the cost of a core
#              while packets are in flight (default 0)
#   STREAMS    streams of the aggregate decode run (default 8; 0: skip)
#   STREAM_SECONDS  its length (default 30)
#   SHARED     the shared data dir with the tokenizer (default ../shared)
#   PROFILE    a directory for each agent's Go CPU profile (agent --cpuprofile;
#              written when the agent stops)
#   COLLECTIVES  vector sizes (floats, comma-separated) of the all-reduce table:
#              two devices on each link run cmd/benchcoll, the same calls
#              through QUIC and through direct links (default
#              2048,65536,1048576; "none": no table). DEVICES=none runs only
#              this table.
#   BENCHCOLL  the benchcoll binary (bin/benchcoll)
#   COLL_POLL  benchcoll's -poll (default: the transport's)
#   DRAFT=1    add a speculative decoding table: on each link, a 2-stage
#              pipeline of DRAFT_MODEL_FOR (the model's shapes with weights
#              of std DRAFT_STD, default 0.0003, so that a draft agrees with
#              it) decodes one stream at temperature 0 through the endpoint,
#              loaded without and with --draft (its first DRAFT_LAYERS
#              layers, default 1: the same seed draws the same embedding,
#              output and first layer); tok/s from TPOT and the drafts the
#              driver's /metrics counts
set -euo pipefail

BIN=${BIN:-bin/shoal}
SHARED=${SHARED:-../shared}
DEVICES=${DEVICES:-1 2 4}
LINKS=${LINKS:-10gbit 1gbit}
STRATEGIES=${STRATEGIES:-auto pipeline tensor auto+prompt pipeline+prompt}
CORES=${CORES:-2}
PROMPT=${PROMPT:-512,2048}
PLAN_PROMPT=${PLAN_PROMPT:-$(tr , '\n' <<<"$PROMPT" | sort -n | tail -n 1)}
GEN=${GEN:-64}
REPS=${REPS:-3}
CTX=${CTX:-2304}
LATENCY=${LATENCY:-10gbit=50us 1gbit=150us}
DELAYLINE=${DELAYLINE:-bin/delayline}
STREAMS=${STREAMS:-8}
STREAM_SECONDS=${STREAM_SECONDS:-30}
COLLECTIVES=${COLLECTIVES:-2048,65536,1048576}
BENCHCOLL=${BENCHCOLL:-bin/benchcoll}
DELAYLINE_SPIN=${DELAYLINE_SPIN:-0}
DRAFT_STD=${DRAFT_STD:-0.0003}
DRAFT_LAYERS=${DRAFT_LAYERS:-1}
if [ "${QUICK:-}" = 1 ]; then
	MODEL=${MODEL:-.shoal/bench-small-q4_0.gguf}
	GENARGS=(--arch llama --n-embd 512 --n-layer 8 --n-head 8 --n-head-kv 4 --n-ff 1408 --type q4_0 --seed 1)
else
	MODEL=${MODEL:-.shoal/bench-tinyllama-q4_0.gguf}
	GENARGS=(--arch llama --n-embd 2048 --n-layer 22 --n-head 32 --n-head-kv 4 --n-ff 5632 --type q4_0 --seed 1)
fi

die() { echo "bench-cluster: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (ip netns, tc, cgroups)"
command -v ip >/dev/null && command -v tc >/dev/null || die "needs iproute2 (ip, tc)"
command -v jq >/dev/null || die "needs jq"
[ -x "$BIN" ] || die "$BIN not built (make build)"
[ "$COLLECTIVES" = none ] || [ -x "$BENCHCOLL" ] || die "$BENCHCOLL not built (go build -o bin/benchcoll ./cmd/benchcoll; make bench-cluster does)"
[ "$LATENCY" = none ] || [ -x "$DELAYLINE" ] || die "$DELAYLINE not built (go build -o bin/delayline ./cmd/delayline; make bench-cluster does)"
CG=/sys/fs/cgroup/cpu
[ -f $CG/cpu.cfs_quota_us ] || die "no cgroup v1 cpu controller at $CG"

if [ "$DEVICES" != none ] && [ ! -f "$MODEL" ]; then
	mkdir -p "$(dirname "$MODEL")"
	vocab=()
	[ -f "$SHARED/tokenizer/ggml-vocab-llama-spm.gguf" ] && vocab=(--vocab-from "$SHARED/tokenizer/ggml-vocab-llama-spm.gguf")
	echo "bench-cluster: generating $MODEL" >&2
	"$BIN" gen-model "${GENARGS[@]}" "${vocab[@]}" -q --out "$MODEL"
fi
[ "$DEVICES" = none ] || MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")
if [ "${DRAFT:-}" = 1 ]; then
	# The model of the draft table and its draft: the same shapes and
	# seed, small weights (at std 0.02 no two random models agree).
	DRAFT_MODEL_FOR=${MODEL%.gguf}-std$DRAFT_STD.gguf
	DRAFT_MODEL=${MODEL%.gguf}-std$DRAFT_STD-draft$DRAFT_LAYERS.gguf
	mkdir -p "$(dirname "$DRAFT_MODEL")"
	vocab=()
	[ -f "$SHARED/tokenizer/ggml-vocab-llama-spm.gguf" ] && vocab=(--vocab-from "$SHARED/tokenizer/ggml-vocab-llama-spm.gguf")
	[ -f "$DRAFT_MODEL_FOR" ] || "$BIN" gen-model "${GENARGS[@]}" "${vocab[@]}" --std "$DRAFT_STD" -q --out "$DRAFT_MODEL_FOR"
	[ -f "$DRAFT_MODEL" ] || "$BIN" gen-model "${GENARGS[@]}" "${vocab[@]}" --std "$DRAFT_STD" --n-layer "$DRAFT_LAYERS" -q --out "$DRAFT_MODEL"
	DRAFT_MODEL_FOR=$(cd "$(dirname "$DRAFT_MODEL_FOR")" && pwd)/$(basename "$DRAFT_MODEL_FOR")
	DRAFT_MODEL=$(cd "$(dirname "$DRAFT_MODEL")" && pwd)/$(basename "$DRAFT_MODEL")
fi

prefix=sb$$
secret=bench-cluster-$$-secret
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench-cluster.XXXXXX")
pids=()
agents=() # the agents' pids, by device
namespaces=()
groups=()

stop_cluster() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do
		for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	pids=()
	agents=()
	for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
	namespaces=()
	for g in "${groups[@]}"; do
		for _ in $(seq 20); do rmdir "$g" 2>/dev/null && break; sleep 0.1; done
	done
	groups=()
	rm -rf "$work"/d[0-9]*/ # every cluster starts from empty data dirs
}
cleanup() {
	stop_cluster
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ipof() { echo "10.78.$1.2"; }

# latency_of RATE: the one-way latency LATENCY gives RATE ("" for none).
latency_of() {
	local kv
	[ "$LATENCY" = none ] && return 0
	for kv in $LATENCY; do
		[ "${kv%%=*}" = "$1" ] && echo "${kv#*=}"
	done
	return 0
}

# shoal_in I ARGS...: the CLI inside device I's namespace, against its agent.
shoal_in() {
	local i=$1
	shift
	SHOAL_ADDR="$(ipof "$i"):7948" SHOAL_TOKEN=$secret ip netns exec "$prefix-d$i" "$BIN" "$@"
}

# start_cluster N RATE: N devices behind a routing hub (through the delay
# line when RATE has a latency), links shaped to RATE, each agent in a
# cgroup with CORES/N (or SHARE) cores. With NOAGENTS=1 only the devices'
# namespaces and cgroups are made.
start_cluster() {
	local n=$1 rate=$2 burst=1mb
	[ "$rate" = 10gbit ] && burst=8mb
	local br=$prefix-br lat
	lat=$(latency_of "$rate")
	ip netns add "$br"
	namespaces+=("$br")
	ip netns exec "$br" sysctl -q -w net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
	ip -n "$br" link set lo up
	if [ -n "$lat" ]; then
		ip netns exec "$br" "$DELAYLINE" --delay "$lat" --spin "$DELAYLINE_SPIN" 2>"$work/delayline.log" &
		pids+=($!)
		for _ in $(seq 50); do ip -n "$br" link show dlout >/dev/null 2>&1 && break; sleep 0.1; done
		ip -n "$br" link set dlin up
		ip -n "$br" link set dlout up
		ip netns exec "$br" sysctl -q -w net.ipv4.conf.dlin.rp_filter=0 net.ipv4.conf.dlout.rp_filter=0
		ip -n "$br" route add default dev dlin table 100
	fi
	local period=${PERIOD_US:-100000} quota threads
	if [ -n "${SHARE:-}" ]; then
		quota=$(awk -v s="$SHARE" -v p="$period" 'BEGIN { printf "%d", s * p }')
		threads=$(awk -v s="$SHARE" 'BEGIN { t = int(s); if (t < s) t++; if (t < 1) t = 1; print t }')
	else
		quota=$((CORES * period / n)) threads=$((CORES / n))
		[ "$threads" -ge 1 ] || threads=1
	fi
	for i in $(seq 0 $((n - 1))); do
		local ns=$prefix-d$i
		ip netns add "$ns"
		namespaces+=("$ns")
		ip link add "$prefix-b$i" type veth peer name "v$i"
		ip link set "v$i" netns "$ns"
		ip link set "$prefix-b$i" netns "$br"
		ip -n "$br" addr add "10.78.$i.1/24" dev "$prefix-b$i"
		ip -n "$br" link set "$prefix-b$i" up
		ip -n "$ns" addr add "$(ipof "$i")/24" dev "v$i"
		ip -n "$ns" link set "v$i" up
		ip -n "$ns" link set lo up
		ip -n "$ns" route add default via "10.78.$i.1"
		# What a device sends goes through the delay line, then out of
		# the hub's port of the device it is for.
		[ -n "$lat" ] && ip -n "$br" rule add iif "$prefix-b$i" lookup 100
		# Both directions: the device's egress and the bridge port's egress.
		ip netns exec "$ns" tc qdisc add dev "v$i" root tbf rate "$rate" burst "$burst" latency 50ms
		ip netns exec "$br" tc qdisc add dev "$prefix-b$i" root tbf rate "$rate" burst "$burst" latency 50ms
		local g=$CG/shoal-$prefix-d$i
		mkdir -p "$g"
		groups+=("$g")
		echo "$period" >"$g/cpu.cfs_period_us"
		echo "$quota" >"$g/cpu.cfs_quota_us"
		[ "${NOAGENTS:-}" = 1 ] && continue
		local args=(agent --server --bootstrap-expect "$n" --name "d$i" --data-dir "$work/d$i" --bind "$(ipof "$i")"
			--token "$secret" --threads "$threads" --log-level warn --insecure-http)
		for j in $(seq 0 $((n - 1))); do [ "$j" != "$i" ] && args+=(--join "$(ipof "$j")"); done
		# PROFILE=DIR: each agent's Go CPU profile, written when it stops.
		[ -n "${PROFILE:-}" ] && mkdir -p "$PROFILE" && args+=(--cpuprofile "$(cd "$PROFILE" && pwd)/d$i-$n-$RANDOM.prof")
		# The shell joins the cgroup, then becomes the agent (same pid).
		sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$g" ip netns exec "$ns" "$BIN" "${args[@]}" >"$work/d$i.log" 2>&1 &
		pids+=($!)
		agents+=($!)
	done
	[ "${NOAGENTS:-}" = 1 ] && return 0
	local deadline=$((SECONDS + 90))
	until shoal_in 0 status -o json 2>/dev/null | jq -e --argjson n "$n" '.health == "healthy" and .nodes_alive == $n' >/dev/null; do
		[ $SECONDS -lt $deadline ] || { tail -n 20 "$work"/d*.log >&2; die "$n agents not healthy within 90 s"; }
		sleep 0.5
	done
	# Let the first link probes land in the state: the planner reads them.
	[ "$n" -gt 1 ] && sleep 5
	return 0
}

# cpu_ticks: the CPU time (user + system, clock ticks) each agent used so
# far, space-separated in device order.
cpu_ticks() {
	local p out=""
	for p in "${agents[@]}"; do
		out+="$(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0) "
	done
	echo "$out"
}

# driver_index MODEL: the device whose agent drives MODEL's plan.
driver_index() {
	local drv i di=0
	drv=$(shoal_in 0 placement show "$1" -o json | jq -r '.stages[0].members[0].node')
	for i in $(seq 0 $((${#agents[@]} - 1))); do
		shoal_in 0 node ls -o json | jq -e --arg id "$drv" --arg nm "d$i" '.[] | select(.id == $id and .name == $nm)' >/dev/null && di=$i
	done
	echo "$di"
}

# run_one N RATE STRATEGY OUT: appends one JSON line with the results to
# OUT. (Not in a subshell: the cleanup must see the namespaces it made.)
run_one() {
	local n=$1 rate=$2 strategy=$3 out=$4
	start_cluster "$n" "$rate"
	# STRATEGY[+prompt]: the forced strategy (auto: none), and whether the
	# plan is made for PLAN_PROMPT-token prompts.
	local base=${strategy%+prompt} planfor=()
	[ "$base" != "$strategy" ] && planfor=(--plan-prompt "$PLAN_PROMPT")
	local load=(model load "$MODEL" --name bench --ctx "$CTX" --overhead 256MiB --wait 600s "${planfor[@]}")
	[ "$base" != auto ] && [ "$n" -gt 1 ] && load+=(--strategy "$base")
	shoal_in 0 "${load[@]}" >&2 || { tail -n 20 "$work"/d*.log >&2; die "load failed ($n devices, $rate, $strategy)"; }
	local pl
	pl=$(shoal_in 0 placement show bench -o json)
	shoal_in 0 placement show bench >&2 || true
	# Served once the driver lists it.
	local deadline=$((SECONDS + 120)) res="" t0 c0 t1 c1
	t0=$(date +%s.%N) c0=$(cpu_ticks)
	until res=$(shoal_in 0 bench --cluster "$(ipof 0):7948" --model bench -p "$PROMPT" -n "$GEN" -r "$REPS" --json 2>"$work/bench.err"); do
		grep -q "not served yet\|not loaded" "$work/bench.err" || { cat "$work/bench.err" >&2; die "bench failed ($n devices, $rate, $strategy)"; }
		[ $SECONDS -lt $deadline ] || die "model not served within 120 s"
		sleep 1
	done
	t1=$(date +%s.%N) c1=$(cpu_ticks)
	# The cores each device used during the benchmark: its quota at most,
	# unless the quota leaks.
	local used
	used=$(awk -v a="$c0" -v b="$c1" -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" 'BEGIN {
		n = split(a, x, " "); split(b, y, " "); s = "["
		for (i = 1; i <= n; i++) s = s (i > 1 ? "," : "") sprintf("%.3f", (y[i] - x[i]) / hz / (t1 - t0))
		print s "]" }')
	local caps
	caps=$(shoal_in 0 node ls -o json | jq -c '[.[] | {name, mem_gbps: (.caps.mem_gbps // .capabilities.mem_gbps // .mem_gbps // 0)}]')
	local agg=null pl8=null
	if [ "$STREAMS" -gt 0 ]; then
		# The same plan for STREAMS sequences a step, STREAMS streams at once.
		shoal_in 0 model unload bench >&2 || die "unload failed"
		load=(model load "$MODEL" --name bench --ctx "$CTX" --max-seqs "$STREAMS" --overhead 256MiB --wait 600s "${planfor[@]}")
		[ "$base" != auto ] && [ "$n" -gt 1 ] && load+=(--strategy "$base")
		shoal_in 0 "${load[@]}" >&2 || { tail -n 20 "$work"/d*.log >&2; die "load of $STREAMS sequences failed ($n devices, $rate, $strategy)"; }
		pl8=$(shoal_in 0 placement show bench -o json)
		local di
		di=$(driver_index bench)
		deadline=$((SECONDS + 120))
		until agg=$(timeout --signal=INT --kill-after=30 $((STREAM_SECONDS + 300)) ip netns exec "$prefix-br" "$BIN" bench-endpoint \
			--endpoint "http://$(ipof "$di"):7948" --token "$secret" -m bench --api completions --temperature 0 --json \
			-c "$STREAMS" -n "$GEN" --prompt-tokens 16 --duration "${STREAM_SECONDS}s" --steady 2>"$work/agg.err"); do
			[ $SECONDS -lt $deadline ] || { cat "$work/agg.err" >&2; die "the $STREAMS-stream run failed ($n devices, $rate, $strategy)"; }
			sleep 2
		done
		agg=$(echo "$agg" | jq -c '.levels[0] | {tok_per_sec: .tokens_per_second, itl_p50_ms: .inter_token.p50_ms, errors}')
	fi
	jq -c -n --argjson n "$n" --arg link "$rate" --arg lat "$(latency_of "$rate")" --arg asked "$strategy" --argjson pl "$pl" --argjson pl8 "$pl8" \
		--argjson res "$res" --argjson agg "$agg" --argjson caps "$caps" --argjson used "$used" '{
		devices: $n, link: $link, latency: $lat, asked: $asked, strategy: $res.strategy, stages: $res.stages,
		predicted_ms: $pl.cost.ms_per_token, cost: $pl.cost, predicted8_ms: ($pl8.cost.ms_per_token // null),
		decode: ($res.results[] | select(.test | startswith("tg"))),
		prompt: ([$res.results[] | select(.test | startswith("pp"))][0]),
		prompts: [$res.results[] | select(.test | startswith("pp"))],
		streams: $agg, caps: $caps, cores_used: $used}' >>"$out"
	stop_cluster
}

# draft_count DEVICE NAME: the tokens drafted and accepted so far for
# model NAME on DEVICE's agent (its /metrics), as "drafted accepted".
draft_count() {
	ip netns exec "$prefix-br" curl -s -H "Authorization: Bearer $secret" "http://$(ipof "$1"):7948/metrics" |
		awk -v m="model=\"$2\"" 'index($0, m) && /^shoal_draft_tokens_total/ { d = $2 } index($0, m) && /^shoal_draft_tokens_accepted_total/ { a = $2 }
			END { printf "%d %d", d, a }'
}

# run_draft RATE OUT: one stream through a 2-stage pipeline of
# DRAFT_MODEL_FOR, loaded without and with --draft, one JSON line each.
run_draft() {
	local rate=$1 out=$2 name draft di res before after
	start_cluster 2 "$rate"
	for name in plain draft; do
		draft=()
		[ "$name" = draft ] && draft=(--draft "$DRAFT_MODEL")
		shoal_in 0 model load "$DRAFT_MODEL_FOR" --name "$name" --ctx "$CTX" --overhead 256MiB --wait 600s --strategy pipeline "${draft[@]}" >&2 ||
			{ tail -n 20 "$work"/d*.log >&2; die "load of $name failed ($rate)"; }
		shoal_in 0 model ls >&2 || true
		di=$(driver_index "$name")
		before=$(draft_count "$di" "$name")
		local deadline=$((SECONDS + 120))
		until res=$(timeout --signal=INT --kill-after=30 600 ip netns exec "$prefix-br" "$BIN" bench-endpoint \
			--endpoint "http://$(ipof "$di"):7948" --token "$secret" -m "$name" --api completions --temperature 0 --json \
			-c 1 -n "$GEN" --prompt-tokens 16 --requests "$REPS" 2>"$work/draft.err"); do
			grep -q "not served yet" "$work/draft.err" || { cat "$work/draft.err" >&2; die "the $name stream failed ($rate)"; }
			[ $SECONDS -lt $deadline ] || die "$name not served within 120 s ($rate)"
			sleep 1
		done
		after=$(draft_count "$di" "$name")
		echo "$res" | jq -c --arg link "$rate" --arg lat "$(latency_of "$rate")" --arg name "$name" --arg b "$before" --arg a "$after" \
			'.levels[0] | {link: $link, latency: $lat, model: $name, tok_per_sec: .per_stream_tokens_per_second, generated: .generated_tokens, errors,
			drafted: (($a | split(" ")[0] | tonumber) - ($b | split(" ")[0] | tonumber)), accepted: (($a | split(" ")[1] | tonumber) - ($b | split(" ")[1] | tonumber))}' >>"$out"
		shoal_in 0 model unload "$name" >&2 || die "unload failed"
	done
	stop_cluster
}

# run_collectives RATE OUT: the all-reduce of two devices on RATE, through
# QUIC and through direct links, one JSON line per size and path.
run_collectives() {
	local rate=$1 out=$2 members i
	NOAGENTS=1 start_cluster 2 "$rate"
	members="$(ipof 0):7947,$(ipof 1):7947"
	for i in 1 0; do
		sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$CG/shoal-$prefix-d$i" ip netns exec "$prefix-d$i" \
			"$BENCHCOLL" -bind "$(ipof "$i"):7947" -members "$members" -rank "$i" -secret "$secret" -floats "$COLLECTIVES" ${COLL_POLL:+-poll "$COLL_POLL"} -json >"$work/coll$i.out" 2>"$work/coll$i.err" &
		pids+=($!)
	done
	for i in 1 2; do
		wait "${pids[-i]}" || { cat "$work"/coll*.err >&2; die "benchcoll failed ($rate)"; }
	done
	jq -c --arg link "$rate" --arg lat "$(latency_of "$rate")" '. + {link: $link, latency: $lat}' "$work/coll0.out" >>"$out"
	stop_cluster
	# what the delay line says of itself when it stops: packets, overshoot
	[ -f "$work/delayline.log" ] && tail -n 1 "$work/delayline.log" >&2
	return 0
}

echo "bench-cluster: $(basename "$MODEL"), ${SHARE:+$SHARE core(s) per device of }$CORES cores, links shaped by tc tbf, latency from the delay line ($LATENCY)" >&2
results=$work/results.jsonl
: >"$results"
colls=$work/collectives.jsonl
: >"$colls"
if [ "$COLLECTIVES" != none ]; then
	for rate in $LINKS; do
		echo "bench-cluster: all-reduce of 2 devices, $rate" >&2
		run_collectives "$rate" "$colls"
	done
fi
drafts=$work/drafts.jsonl
: >"$drafts"
if [ "${DRAFT:-}" = 1 ]; then
	for rate in $LINKS; do
		echo "bench-cluster: speculative decoding, 2 devices, $rate" >&2
		run_draft "$rate" "$drafts"
	done
fi
[ "$DEVICES" = none ] && DEVICES=""
one=$work/one.jsonl
for rate in $LINKS; do
	for n in $DEVICES; do
		if [ "$n" = 1 ]; then
			# One device sends nothing over its link: measure it once.
			[ -s "$one" ] || run_one 1 "$rate" auto "$one"
			jq -c --arg link "$rate" '.link = $link' "$one" >>"$results"
			continue
		fi
		for s in $STRATEGIES; do
			echo "bench-cluster: $n devices, $rate, $s" >&2
			run_one "$n" "$rate" "$s" "$results"
		done
	done
done

echo
if [ -n "${SHARE:-}" ]; then
	echo "model $(basename "$MODEL"); CPU: $SHARE core(s) per device (cgroup v1 quota, period ${PERIOD_US:-100000} us); links: tbf rate, one-way latency $LATENCY (delay line)"
else
	echo "model $(basename "$MODEL"); CPU: $CORES cores split evenly over the devices (cgroup v1 quota); links: tbf rate, one-way latency $LATENCY (delay line)"
fi
echo "1 stream: tg$GEN and pp$PROMPT, $REPS runs each; $STREAMS streams: aggregate tok/s of completions of $GEN tokens over ${STREAM_SECONDS} s"
echo "bytes/token: payload sent between nodes per decoded token (1 stream); predicted/measured ms: a decode step of 1 sequence, and of $STREAMS (measured: the streams' inter-token p50)"
echo
printf '| %-7s | %-6s | %-8s | %-9s | %-9s | %-9s | %-11s | %-11s | %-15s | %-15s | %-24s | %-11s |\n' devices link asked plan "1-str t/s" "pp t/s" "$STREAMS-str t/s" bytes/token "1: pred/meas ms" "$STREAMS: pred/meas ms" "predicted comp/mem/net" "dev GB/s"
printf '| %-7s | %-6s | %-8s | %-9s | %-9s | %-9s | %-11s | %-11s | %-15s | %-15s | %-24s | %-11s |\n' ------: ------ -------- --------- --------: --------: ----------: ----------: --------------: --------------: ----------------------- -----------
jq -r '[.devices, .link, .asked, .strategy, (.decode.tok_per_sec*100|round/100), (.prompt.tok_per_sec*100|round/100),
	((.streams.tok_per_sec // 0)*100|round/100), (.decode.bytes_per_token|round),
	"\(.predicted_ms*100|round/100) / \(.decode.ms_per_token*100|round/100)",
	"\((.predicted8_ms // 0)*100|round/100) / \((.streams.itl_p50_ms // 0)*100|round/100)",
	"\(.cost.compute_ms*100|round/100)/\(.cost.memory_ms*100|round/100)/\(.cost.network_ms*100|round/100)",
	([.caps[].mem_gbps | .*10|round/10] | map(tostring) | join(","))] | @tsv' "$results" |
	while IFS=$'\t' read -r d l a s dt pt at b p1 p8 br bw; do
		printf '| %7s | %-6s | %-8s | %-9s | %9s | %9s | %11s | %11s | %15s | %15s | %24s | %11s |\n' "$d" "$l" "$a" "$s" "$dt" "$pt" "$at" "$b" "$p1" "$p8" "$br" "$bw"
	done
echo
echo "prefill (time to first token) of one prompt: tok/s, the ratio to one device on the same link, TTFT measured and predicted (placement.PredictPrefill)"
echo
printf '| %-7s | %-6s | %-8s | %-9s | %-7s | %-9s | %-8s | %-12s | %-12s | %-7s |\n' devices link asked plan prompt "pp t/s" "x 1 dev" "TTFT ms" "predicted ms" "error"
printf '| %-7s | %-6s | %-8s | %-9s | %-7s | %-9s | %-8s | %-12s | %-12s | %-7s |\n' ------: ------ -------- --------- ------: --------: -------: -----------: -----------: ------:
jq -s -r '(map(select(.devices == 1)) | map({key: .link, value: (.prompts | map({key: .test, value: .tok_per_sec}) | from_entries)}) | from_entries) as $one |
	.[] | . as $r | .prompts[] | (.test | ltrimstr("pp") | tonumber) as $n |
	($n * .ms_per_token) as $meas | ($n * (.predicted_ms_per_token // 0)) as $pred |
	[$r.devices, $r.link, $r.asked, $r.strategy, $n, (.tok_per_sec*10|round/10),
	 (if ($one[$r.link][.test] // 0) > 0 then (.tok_per_sec / $one[$r.link][.test] * 100 | round / 100) else "-" end),
	 ($meas|round), (if $pred > 0 then ($pred|round) else "-" end),
	 (if $pred > 0 then "\(($pred / $meas - 1) * 100 | round)%" else "-" end)] | @tsv' "$results" |
	while IFS=$'\t' read -r d l a s n t x m p e; do
		printf '| %7s | %-6s | %-8s | %-9s | %7s | %9s | %8s | %12s | %12s | %7s |\n' "$d" "$l" "$a" "$s" "$n" "$t" "$x" "$m" "$p" "$e"
	done
if [ -s "$colls" ]; then
	echo
	echo "all-reduce of 2 devices (cmd/benchcoll, one process per device in its namespace and cgroup): µs per call through QUIC streams and through direct links (TCP)"
	echo
	echo "(ping: the link's round trip of a UDP datagram through the delay line, min/avg µs, which no call can beat: an all-reduce's messages cross it once, in both directions at once)"
	echo
	printf '| %-6s | %-7s | %-11s | %-9s | %-5s | %-7s | %-6s | %-9s | %-9s | %-9s |\n' link latency "ping µs" floats dtype path calls "mean µs" "p50 µs" "p99 µs"
	printf '| %-6s | %-7s | %-11s | %-9s | %-5s | %-7s | %-6s | %-9s | %-9s | %-9s |\n' ------ ------- ----------- --------: ----- ------- -----: --------: --------: --------:
	jq -r '[.link, (if (.latency // "") == "" then "none" else .latency end), "\(.ping_min_us // "-" | if type == "number" then .*10|round/10 else . end)/\(.ping_avg_us // "-" | if type == "number" then .*10|round/10 else . end)", .floats, .dtype, .path, .calls, (.mean_us*10|round/10), (.p50_us*10|round/10), (.p99_us*10|round/10)] | @tsv' "$colls" |
		while IFS=$'\t' read -r l la pg f d p c m p50 p99; do
			printf '| %-6s | %-7s | %-11s | %9s | %-5s | %-7s | %6s | %9s | %9s | %9s |\n' "$l" "$la" "$pg" "$f" "$d" "$p" "$c" "$m" "$p50" "$p99"
		done
fi
if [ -s "$drafts" ]; then
	echo
	echo "speculative decoding: a 2-stage pipeline of $(basename "$DRAFT_MODEL_FOR"), one stream at temperature 0 (tg$GEN, $REPS requests of 16 random prompt tokens), without and with --draft $(basename "$DRAFT_MODEL"); tok/s from TPOT; drafts as the driver's /metrics counts them"
	echo
	printf '| %-6s | %-7s | %-6s | %-9s | %-7s | %-8s | %-8s | %-9s |\n' link latency model "tok/s" "x plain" drafted accepted "accepted%"
	printf '| %-6s | %-7s | %-6s | %-9s | %-7s | %-8s | %-8s | %-9s |\n' ------ ------- ------ --------: ------: -------: -------: --------:
	jq -s -r '(map(select(.model == "plain")) | map({key: .link, value: .tok_per_sec}) | from_entries) as $plain | .[] |
		[.link, .latency, .model, (.tok_per_sec*100|round/100), (if ($plain[.link] // 0) > 0 then (.tok_per_sec / $plain[.link] * 100 | round / 100) else "-" end),
		 .drafted, .accepted, (if .drafted > 0 then (.accepted / .drafted * 100 | round) else "-" end)] | @tsv' "$drafts" |
		while IFS=$'\t' read -r l la m t x d a p; do
			printf '| %-6s | %-7s | %-6s | %9s | %7s | %8s | %8s | %9s |\n' "$l" "$la" "$m" "$t" "$x" "$d" "$a" "$p"
		done
fi
echo
jq -r '"plan of \(.devices) device(s), \(.link), \(.asked): \(.stages | join(", ")); 1 stream measured: compute \(.decode.compute_ms // 0 | .*100|round/100) ms + other \((.decode.ms_per_token - (.decode.compute_ms // 0)) | .*100|round/100) ms a token; cores each device used during bench --cluster: \(.cores_used // [] | map(tostring) | join(", "))"' "$results"
cp "$results" "${RESULTS:-bench-cluster-results.jsonl}" 2>/dev/null || true
