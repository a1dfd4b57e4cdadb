#!/usr/bin/env bash
# Disaggregated serving on two emulated devices (issue 22, must-show 2 and 4).
#
# Each device is a network namespace on a bridge, its link shaped both ways
# with tc tbf to the link rate, its agent in a cgroup v1 CPU group of SHARE
# cores (default 1) with --threads to match. The load generator (shoal
# bench-endpoint) runs in the bridge namespace, outside every quota, against
# the OpenAI endpoint of the node that drives the plan.
#
# Per configuration: STREAMS decode streams (a short prompt, GEN tokens,
# greedy) run for DURATION while, from INTERVAL after the start, a request
# with a LONG-token prompt of random token ids (a new one each time: no
# prefix cache helps) and LONG_GEN output tokens arrives every INTERVAL.
# Before that, one long prompt runs alone (after an untimed one) to show the
# isolated prefill time. Configurations:
#   a  one device serving the whole model, decode streams alone (no long
#      prompts); measured once, it is the same at every link rate
#   l  as a, with the long prompts arriving: what the decode device does
#      when it prefills them itself (the other way (d)'s rule can go;
#      measured once too)
#   a+ as a, while a second 1-core cgroup runs prefill (shoal bench -p LONG)
#      on the same model: does a busy neighbour (shared memory bus, caches,
#      SMT) slow a device's decode? (measured once too)
#   b  colocated: two devices, one shared pool (--disagg off, no pins; the
#      planner chooses the plan), long prompts arriving
#   bp as b with --strategy pipeline: the shared pool spans both devices
#      (the planner may well have put the model on one device for b)
#   c  disaggregated: device 1 pinned --role prefill, --disagg on
#   d  as c with --disagg auto: the routing rule decides per long prompt
# For every configuration with a prefill pool it reads the agents' /metrics
# before and after the run: remote prefills (ok/failed) and their tokens
# from the driver, KV bytes on the wire (payload, framing) from the prefill
# agent, and prints bytes per remote-prefilled prompt token beside the
# model's KV bytes per token (2 · layers · kv heads · head dim · 2, F16).
#
# Links carry only a rate: this kernel has no netem, so no latency is added.
#
#   sudo cmd/shoal/scripts/bench-disagg.sh            # or: make bench-disagg
#
# Environment:
#   BIN        shoal binary (bin/shoal)
#   MODEL      GGUF file (default .shoal/bench-tinyllama-q4_0.gguf: a random
#              llama with TinyLlama-1.1B's shapes in Q4_0, made if missing)
#   KV_BYTES   the model's KV bytes per token (default: from the shapes of
#              the generated model; set it with your own MODEL)
#   QUICK=1    a small model (.shoal/bench-small-q4_0.gguf) and short runs
#   LINKS      link rates (default "10gbit 1gbit")
#   CONFIGS    configurations (default "a a+ l b bp c d")
#   SHARE      cores per device (default 1); PERIOD_US the CFS period
#   STREAMS, GEN        decode streams and their max_tokens (8, 256)
#   LONG, LONG_GEN      long prompt tokens and max_tokens (1024, 16)
#   INTERVAL   seconds between long prompts (default 20: see below)
#   DURATION   seconds of each measured run (default 120)
#   CTX, MAX_SEQS       the plan's context and sequences (2048, 12)
#   SHARED     the shared data dir with the tokenizer (default ../shared)
#   KEEP=1     keep the work dir (agent logs, JSON results)
#   LOG_LEVEL  of the agents (default warn)
#   AGENT_PROFILE=1  each agent writes a Go CPU profile of its run to the
#              work dir (CONFIG-LINK-dN.prof; KEEP=1 keeps it)
#   AGENT_GOMAXPROCS  GOMAXPROCS of the agents (default: Go's, which is 2
#              under a 1-core quota: two threads then spend the quota in
#              half a CFS period and the agent is throttled for the rest)
#   OTHER_MAX  cores the machine may spend beyond the agents during a run
#              before it is measured again (default 0.15)
#
# INTERVAL: one 1,024-token prompt of the TinyLlama-shaped model alone on
# one 1-core Zen 5 device (config a, measured first) has a TTFT of 7.6 s;
# one every 20 s keeps the prefill device about 40% busy, so long prompts
# do not queue behind each other and a TTFT is one prefill, not a backlog,
# while 120 s still see 5 of them.
set -euo pipefail

BIN=${BIN:-bin/shoal}
SHARED=${SHARED:-../shared}
LINKS=${LINKS:-10gbit 1gbit}
CONFIGS=${CONFIGS:-a a+ l b bp c d}
SHARE=${SHARE:-1}
STREAMS=${STREAMS:-8}
GEN=${GEN:-256}
LONG=${LONG:-1024}
LONG_GEN=${LONG_GEN:-16}
CTX=${CTX:-2048}
MAX_SEQS=${MAX_SEQS:-12}
if [ "${QUICK:-}" = 1 ]; then
	MODEL=${MODEL:-.shoal/bench-small-q4_0.gguf}
	SHAPE=(512 8 8 4) # n_embd n_layer n_head n_head_kv
	GENARGS=(--arch llama --n-embd 512 --n-layer 8 --n-head 8 --n-head-kv 4 --n-ff 1408 --type q4_0 --seed 1)
	INTERVAL=${INTERVAL:-5}
	DURATION=${DURATION:-30}
else
	MODEL=${MODEL:-.shoal/bench-tinyllama-q4_0.gguf}
	SHAPE=(2048 22 32 4)
	GENARGS=(--arch llama --n-embd 2048 --n-layer 22 --n-head 32 --n-head-kv 4 --n-ff 5632 --type q4_0 --seed 1)
	INTERVAL=${INTERVAL:-20}
	DURATION=${DURATION:-120}
fi
# 2 (K and V) · layers · kv heads · head dim · 2 bytes (F16).
KV_BYTES=${KV_BYTES:-$((2 * SHAPE[1] * SHAPE[3] * (SHAPE[0] / SHAPE[2]) * 2))}

die() { echo "bench-disagg: $*" >&2; exit 1; }
say() { echo "bench-disagg: $*" >&2; }
[ "$(id -u)" = 0 ] || die "needs root (ip netns, tc, cgroups)"
command -v ip >/dev/null && command -v tc >/dev/null || die "needs iproute2 (ip, tc)"
command -v jq >/dev/null && command -v curl >/dev/null || die "needs jq and curl"
[ -x "$BIN" ] || die "$BIN not built (make build)"
CG=/sys/fs/cgroup/cpu
[ -f $CG/cpu.cfs_quota_us ] || die "no cgroup v1 cpu controller at $CG"
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

if [ ! -f "$MODEL" ]; then
	mkdir -p "$(dirname "$MODEL")"
	vocab=()
	[ -f "$SHARED/tokenizer/ggml-vocab-llama-spm.gguf" ] && vocab=(--vocab-from "$SHARED/tokenizer/ggml-vocab-llama-spm.gguf")
	say "generating $MODEL"
	"$BIN" gen-model "${GENARGS[@]}" "${vocab[@]}" -q --out "$MODEL"
fi
MODEL=$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")

prefix=sd$$
secret=bench-disagg-$$-secret
work=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench-disagg.XXXXXX")
pids=()
namespaces=()
groups=()
br=$prefix-br
client_ip=10.79.0.254

stop_cluster() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do
		for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	pids=()
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
	if [ "${KEEP:-}" = 1 ]; then say "work dir kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ipof() { echo "10.79.0.$(($1 + 1))"; }

# shoal_in I ARGS...: the CLI in the bridge namespace, against agent I.
shoal_in() {
	local i=$1
	shift
	SHOAL_ADDR="http://$(ipof "$i"):7948" SHOAL_TOKEN=$secret ip netns exec "$br" "$BIN" "$@"
}

# quota_of SHARE: the CFS quota and thread count of SHARE cores.
period=${PERIOD_US:-100000}
quota=$(awk -v s="$SHARE" -v p="$period" 'BEGIN { printf "%d", s * p }')
threads=$(awk -v s="$SHARE" 'BEGIN { t = int(s); if (t < s) t++; if (t < 1) t = 1; print t }')

# The agents' environment: GOMAXPROCS (AGENT_GOMAXPROCS; Go's default in a
# cgroup with a quota of one core is 2, its minimum).
agent_env=()
[ -n "${AGENT_GOMAXPROCS:-}" ] && agent_env+=("GOMAXPROCS=$AGENT_GOMAXPROCS")

# new_group NAME: a cgroup of SHARE cores, its path in $group (not a
# subshell: stop_cluster must see it in $groups to remove it).
new_group() {
	group=$CG/shoal-$prefix-$1
	mkdir -p "$group"
	groups+=("$group")
	echo "$period" >"$group/cpu.cfs_period_us"
	echo "$quota" >"$group/cpu.cfs_quota_us"
}

# start_cluster RATE ROLE...: one device per ROLE ("both", "prefill"),
# links shaped to RATE, each agent in a cgroup of SHARE cores.
start_cluster() {
	local rate=$1 burst=1mb
	shift
	local roles=("$@") n=$#
	[ "$rate" = 10gbit ] && burst=8mb
	ip netns add "$br"
	namespaces+=("$br")
	ip -n "$br" link add br0 type bridge
	ip -n "$br" addr add "$client_ip/24" dev br0
	ip -n "$br" link set br0 up
	ip -n "$br" link set lo up
	for i in $(seq 0 $((n - 1))); do
		local ns=$prefix-d$i
		ip netns add "$ns"
		namespaces+=("$ns")
		ip link add "$prefix-b$i" type veth peer name "v$i"
		ip link set "v$i" netns "$ns"
		ip link set "$prefix-b$i" netns "$br"
		ip -n "$br" link set "$prefix-b$i" master br0
		ip -n "$br" link set "$prefix-b$i" up
		ip -n "$ns" addr add "$(ipof "$i")/24" dev "v$i"
		ip -n "$ns" link set "v$i" up
		ip -n "$ns" link set lo up
		# Both directions: the device's egress and the bridge port's egress.
		ip netns exec "$ns" tc qdisc add dev "v$i" root tbf rate "$rate" burst "$burst" latency 50ms
		ip netns exec "$br" tc qdisc add dev "$prefix-b$i" root tbf rate "$rate" burst "$burst" latency 50ms
		new_group "d$i"
		local g=$group
		local args=(agent --server --bootstrap-expect "$n" --name "d$i" --data-dir "$work/d$i" --bind "$(ipof "$i")"
			--token "$secret" --threads "$threads" --log-level "${LOG_LEVEL:-warn}" --insecure-http)
		[ "${roles[$i]}" != both ] && args+=(--role "${roles[$i]}")
		[ -n "${AGENT_PROFILE:-}" ] && args+=(--cpuprofile "$work/$name-$rate-d$i.prof")
		for j in $(seq 0 $((n - 1))); do [ "$j" != "$i" ] && args+=(--join "$(ipof "$j")"); done
		# The shell joins the cgroup, then becomes the agent (same pid).
		sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$g" env "${agent_env[@]}" ip netns exec "$ns" "$BIN" "${args[@]}" >"$work/d$i.log" 2>&1 &
		pids+=($!)
	done
	local deadline=$((SECONDS + 90))
	until shoal_in 0 status -o json 2>/dev/null | jq -e --argjson n "$n" '.health == "healthy" and .nodes_alive == $n' >/dev/null; do
		[ $SECONDS -lt $deadline ] || { tail -n 20 "$work"/d*.log >&2; die "$n agents not healthy within 90 s"; }
		sleep 0.5
	done
	# Let the first link probes land in the state: the planner and the
	# routing rule read them.
	[ "$n" -gt 1 ] && sleep 5
	return 0
}

# metric I NAME LABELRE: the sum of agent I's series NAME whose labels
# match LABELRE (0 if none).
metric() {
	ip netns exec "$br" curl -fsS --max-time 10 -H "Authorization: Bearer $secret" "http://$(ipof "$1"):7948/metrics" |
		awk -v n="$2" -v re="$3" '{ split($1, a, "{") } a[1] == n && $1 ~ re { s += $NF } END { printf "%.0f\n", s }'
}

# busy_ticks: the machine's busy CPU time in clock ticks (/proc/stat).
busy_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }

# own_ticks PID...: the CPU time of those processes and their children
# (utime + stime, in clock ticks); a process gone counts 0.
own_ticks() {
	local p t=0 c
	for p in "$@"; do
		for c in "$p" $(pgrep -P "$p" 2>/dev/null); do
			[ -r "/proc/$c/stat" ] && t=$((t + $(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$c/stat" 2>/dev/null || echo 0)))
		done
	done
	echo "$t"
}

# throttled: per device cgroup, the CFS periods it was throttled in and
# for how long (ms), as JSON.
throttled() {
	local g out='{}'
	for g in "${groups[@]}"; do
		out=$(jq -c --arg g "${g##*-}" --argjson n "$(awk '$1 == "nr_throttled" { print $2 }' "$g/cpu.stat")" \
			--argjson t "$(awk '$1 == "throttled_time" { printf "%.0f", $2 / 1e6 }' "$g/cpu.stat")" '.[$g] = {periods: $n, ms: $t}' <<<"$out")
	done
	echo "$out"
}

# snapshot DRIVER PREFILL: the counters of a run as JSON.
snapshot() {
	local d=$1 p=$2
	jq -n --argjson ok "$(metric "$d" shoal_remote_prefills_total 'outcome="ok"')" \
		--argjson failed "$(metric "$d" shoal_remote_prefills_total 'outcome="failed"')" \
		--argjson tokens "$(metric "$d" shoal_remote_prefill_tokens_total '')" \
		--argjson seconds "$(metric "$d" shoal_remote_prefill_seconds_total '')" \
		--argjson payload "$(metric "$p" shoal_kv_link_bytes_total 'direction="sent".*kind="payload"|kind="payload".*direction="sent"')" \
		--argjson framing "$(metric "$p" shoal_kv_link_bytes_total 'direction="sent".*kind="framing"|kind="framing".*direction="sent"')" \
		--argjson queue "$(metric "$d" shoal_remote_prefill_phase_seconds_total 'phase="queue"')" \
		--argjson open "$(metric "$d" shoal_remote_prefill_phase_seconds_total 'phase="open"')" \
		--argjson step "$(metric "$d" shoal_remote_prefill_phase_seconds_total 'phase="step"')" \
		--argjson wait "$(metric "$d" shoal_remote_prefill_phase_seconds_total 'phase="wait"')" \
		'{ok: $ok, failed: $failed, tokens: $tokens, seconds: $seconds, payload: $payload, framing: $framing,
		  phases: {queue: $queue, open: $open, step: $step, wait: $wait}}'
}

# bench_endpoint DRIVER ARGS...: shoal bench-endpoint from the bridge
# namespace against the driver, bounded in time.
bench_endpoint() {
	local d=$1
	shift
	timeout --signal=INT --kill-after=30 $((DURATION + 420)) ip netns exec "$br" "$BIN" bench-endpoint \
		--endpoint "http://$(ipof "$d"):7948" --token "$secret" -m bench --api completions --temperature 0 --json "$@"
}

# others: the CI runs and the other benchmark scripts running (not this
# one nor its subshells), one "pid command" a line.
others() {
	local p q
	pgrep -af '\.ci/run|bench-(disagg|cluster)\.sh' | while read -r p _; do
		q=$p
		while [ "$q" -gt 1 ] && [ "$q" != $$ ]; do q=$(ps -o ppid= -p "$q" 2>/dev/null | tr -d ' ') || break; [ -n "$q" ] || break; done
		[ "$q" = $$ ] || ps -o pid=,args= -p "$p" 2>/dev/null || true
	done
}

# wait_ci: no CI run nor another benchmark on the machine (it would share
# the cores).
wait_ci() {
	local waited=0
	while [ -n "$(others)" ]; do
		[ $waited = 0 ] && say "waiting for other work to finish: $(others | head -1)"
		waited=1
		sleep 10
	done
}

# run_config NAME RATE OUT: one configuration; appends a JSON line to OUT.
run_config() {
	local name=$1 rate=$2 out=$3 roles disagg
	local strategy=()
	case $name in
	a | a+ | l) roles=(both) disagg=off ;;
	b) roles=(both both) disagg=off ;;
	bp) roles=(both both) disagg=off strategy=(--strategy pipeline) ;;
	c) roles=(both prefill) disagg=on ;;
	d) roles=(both prefill) disagg=auto ;;
	*) die "unknown configuration $name (want a, a+, l, b, bp, c or d)" ;;
	esac
	wait_ci
	say "config $name, ${#roles[@]} device(s), link $rate, --disagg $disagg"
	start_cluster "$rate" "${roles[@]}"
	shoal_in 0 model load "$MODEL" --name bench --ctx "$CTX" --max-seqs "$MAX_SEQS" --replicas 1 --overhead 256MiB \
		--disagg "$disagg" "${strategy[@]}" --wait 600s >&2 || { tail -n 20 "$work"/d*.log >&2; die "load failed ($name, $rate)"; }
	local pl
	pl=$(shoal_in 0 placement show bench -o json)
	shoal_in 0 placement show bench >"$work/plan-$name-$rate.txt" 2>&1 || true
	# The driver: the first member of the first stage (of the decode pool
	# when there is one); the prefill agent: the first of the prefill pool.
	local driver_name prefill_name driver prefill=-1
	driver_name=$(jq -r '[.stages[] | select(.pool != "prefill")][0].members[0].node_name' <<<"$pl")
	prefill_name=$(jq -r '[.stages[] | select(.pool == "prefill")][0].members[0].node_name // ""' <<<"$pl")
	driver=${driver_name#d}
	[ -n "$prefill_name" ] && prefill=${prefill_name#d}
	local deadline=$((SECONDS + 120))
	until ip netns exec "$br" curl -fsS --max-time 5 -H "Authorization: Bearer $secret" "http://$(ipof "$driver"):7948/v1/models" 2>/dev/null | jq -e '.data | map(.id) | index("bench")' >/dev/null; do
		[ $SECONDS -lt $deadline ] || die "model not served by $driver_name within 120 s"
		sleep 1
	done
	# A busy neighbour for a+: prefill on the same model in another cgroup
	# of SHARE cores, bounded in count and time.
	local hog=""
	if [ "$name" = a+ ]; then
		new_group hog
		local g=$group
		timeout --kill-after=10 $((DURATION + 200)) sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$g" \
			"$BIN" bench -m "$MODEL" -t "$threads" -p "$LONG" -n 0 -r 1000 >"$work/hog.log" 2>&1 &
		hog=$!
		sleep 5
	fi
	# Without a prefill pool the KV counters are the driver's (all zero).
	local kvnode=$prefill
	[ "$kvnode" -ge 0 ] || kvnode=$driver
	# One long prompt alone (after an untimed one): the isolated prefill,
	# and the wire bytes of long prompts alone.
	local alone='{}' alone0 alone1 before after mixed
	alone0=$(snapshot "$driver" "$kvnode")
	if [ "$name" != a+ ]; then
		alone=$(bench_endpoint "$driver" -c 1 -n "$LONG_GEN" --prompt-tokens "$LONG" --requests 1 --warmup 1 2>"$work/alone-$name-$rate.err") ||
			{ cat "$work/alone-$name-$rate.err" >&2; die "the long prompt alone failed ($name, $rate)"; }
	fi
	alone1=$(snapshot "$driver" "$kvnode")
	before=$alone1
	# The long prompt alone warmed the model up (a+: the hog did).
	# Every request's token times go to trace-NAME-RATE.jsonl (KEEP=1).
	local args=(-c "$STREAMS" -n "$GEN" --duration "${DURATION}s" --steady --warmup 0 --trace "$work/trace-$name-$rate.jsonl")
	case $name in
	a | a+) ;;
	*) args+=(--periodic "${INTERVAL}s" --periodic-prompt-tokens "$LONG" --periodic-max-tokens "$LONG_GEN") ;;
	esac
	# The CPU the machine spent beyond the agents (and the a+ neighbour)
	# during the run: the load generator, the kernel's networking, and
	# anything else running, which the run should not share the cores with.
	local busy0 own0 t0=$SECONDS thr0 thr1
	busy0=$(busy_ticks) own0=$(own_ticks "${pids[@]}" $hog) thr0=$(throttled)
	mixed=$(bench_endpoint "$driver" "${args[@]}" 2>"$work/mixed-$name-$rate.err") ||
		{ cat "$work/mixed-$name-$rate.err" >&2; tail -n 20 "$work"/d*.log >&2; die "the run failed ($name, $rate)"; }
	local other
	other=$(awk -v b="$(($(busy_ticks) - busy0))" -v o="$(($(own_ticks "${pids[@]}" $hog) - own0))" -v hz="$(getconf CLK_TCK)" -v t="$((SECONDS - t0))" \
		'BEGIN { printf "%.3f", (b - o) / hz / (t > 0 ? t : 1) }')
	thr1=$(throttled)
	after=$(snapshot "$driver" "$kvnode")
	if [ -n "$hog" ]; then
		kill -TERM "$hog" 2>/dev/null || true
		wait "$hog" 2>/dev/null || true
	fi
	mkdir -p "$work/logs-$name-$rate" && cp "$work"/d*.log "$work/logs-$name-$rate/"
	jq -c -n --arg name "$name" --arg link "$rate" --arg disagg "$disagg" --argjson pl "$pl" --argjson alone "$alone" \
		--argjson mixed "$mixed" --argjson before "$before" --argjson after "$after" --argjson a0 "$alone0" --argjson a1 "$alone1" --argjson other "$other" \
		--argjson thr0 "$thr0" --argjson thr1 "$thr1" '
		def delta(x; y): {ok: (y.ok - x.ok), failed: (y.failed - x.failed), tokens: (y.tokens - x.tokens), seconds: (y.seconds - x.seconds),
			payload: (y.payload - x.payload), framing: (y.framing - x.framing),
			phases: (y.phases | with_entries(.value -= x.phases[.key]))};
		{
		config: $name, link: $link, disagg: $disagg, strategy: $pl.strategy,
		stages: [$pl.stages[] | "\(.pool) [\(.lo),\(.hi)) on \([.members[].node_name] | join("+"))"],
		alone_ttft_ms: ($alone.levels[0].ttft.p50_ms // null), other_cores: $other,
		throttled: ($thr1 | with_entries(.value = {periods: (.value.periods - $thr0[.key].periods), ms: (.value.ms - $thr0[.key].ms)})),
		streams: $mixed.levels[0], long: $mixed.levels[0].periodic,
		remote: delta($before; $after), remote_alone: delta($a0; $a1)}' >>"$out"
	stop_cluster
}

wait_ci
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), family $(grep -m1 'cpu family' /proc/cpuinfo | awk '{print $NF}')"
grep -q -m1 avx512f /proc/cpuinfo && cpu+=", AVX-512" || cpu+=", no AVX-512"
say "$(basename "$MODEL") on $cpu; $SHARE core(s) per device; links shaped by tc tbf (rate only, no netem: no added latency)"
# measure NAME RATE OUT: run_config, again (up to 3 times) when a CI run
# started meanwhile or the machine spent more than OTHER_MAX cores
# (default 0.15) beyond the agents during the run: something else shared
# the cores.
OTHER_MAX=${OTHER_MAX:-0.15}
measure() {
	local try tmp=$work/try.jsonl other
	for try in 1 2 3; do
		: >"$tmp"
		run_config "$1" "$2" "$tmp"
		other=$(jq -r '.other_cores' "$tmp")
		if [ -n "$(others)" ]; then
			say "$(others | head -1) started during config $1 ($2): measuring it again"
		elif awk -v o="$other" -v m="$OTHER_MAX" 'BEGIN { exit !(o > m) }'; then
			say "config $1 ($2): $other cores went to other work than the agents during the run (> OTHER_MAX $OTHER_MAX): measuring it again"
		else
			cat "$tmp" >>"$3"
			return 0
		fi
		cat "$tmp" >>"$work/discarded.jsonl"
	done
	die "config $1 ($2) shared the machine 3 times (see $work/discarded.jsonl)"
}

results=$work/results.jsonl
: >"$results"
one=$work/one.jsonl
: >"$one"
for rate in $LINKS; do
	for c in $CONFIGS; do
		case $c in
		a | a+ | l)
			# One device sends nothing over its link: measure it once.
			[ -n "$(jq -c --arg c "$c" 'select(.config == $c)' "$one")" ] || measure "$c" "$rate" "$one"
			jq -c --arg c "$c" --arg link "$rate" 'select(.config == $c) | .link = $link' "$one" >>"$results"
			;;
		*) measure "$c" "$rate" "$results" ;;
		esac
	done
done
cp "$results" "$work/results-final.jsonl"

echo
echo "model $(basename "$MODEL"); CPU: $cpu; $SHARE core(s) per device (cgroup v1 quota, period $period us, --threads $threads); links: tbf rate both ways, no added latency"
echo "$STREAMS decode streams (short prompt, max_tokens $GEN, greedy) for ${DURATION} s; long prompts: $LONG random token ids, max_tokens $LONG_GEN, one every ${INTERVAL} s from ${INTERVAL} s on"
echo "model KV per token: $KV_BYTES B (2 x layers x kv heads x head dim x 2 B, F16); KV B/token on the wire: the prefill agent's kv link bytes sent (payload + framing) over the remote-prefilled prompt tokens, during the measured run"
for rate in $LINKS; do
	echo
	echo "### link $rate"
	echo
	echo "| configuration | decode ITL p50 (ms) | decode ITL p99 (ms) | long TTFT p50 (s) | long TTFT max (s) | long prompts | remote prefills | KV B/token on the wire | model KV B/token | framing % |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	jq -r --arg link "$rate" --argjson kvb "$KV_BYTES" '
		def f(d): if . == null then "-" else (. * pow(10; d) | round / pow(10; d) | tostring) end;
		def s: if . == null then null else . / 1000 end;
		select(.link == $link) | [
		({"a": "(a) decode alone, 1 device", "a+": "(a+) as (a), a busy neighbour", "l": "(l) 1 device, long prompts prefilled there", "b": "(b) colocated, --disagg off",
		  "bp": "(b-pipe) colocated, --disagg off --strategy pipeline", "c": "(c) disaggregated, --disagg on",
		  "d": "(d) --disagg auto, pinned"}[.config]),
		(.streams.inter_token.p50_ms | f(1)), (.streams.inter_token.p99_ms | f(1)),
		(.long.ttft.p50_ms | s | f(2)), (.long.ttft.max_ms | s | f(2)),
		(if .long then "\(.long.requests)\(if .long.errors > 0 then " (+\(.long.errors) failed)" else "" end)" else "-" end),
		(if .config == "c" or .config == "d" then "\(.remote.ok)\(if .remote.failed > 0 then " (+\(.remote.failed) failed)" else "" end)" else "-" end),
		(if .remote.tokens > 0 then (.remote.payload + .remote.framing) / .remote.tokens else null end | f(0)),
		(if .remote.tokens > 0 then $kvb else null end | f(0)),
		(if .remote.payload > 0 then 100 * .remote.framing / .remote.payload else null end | f(2))] |
		"| " + join(" | ") + " |"' "$results"
	echo
	jq -r --arg link "$rate" --argjson kvb "$KV_BYTES" '
		def r2: . * 100 | round / 100;
		select(.link == $link) |
		"(\(.config)): plan \(.strategy): \(.stages | join("; ")); one long prompt alone: TTFT \(if .alone_ttft_ms then "\(.alone_ttft_ms / 1000 | r2) s" else "-" end)" +
		"; other work \(.other_cores) cores; CFS throttling \(.throttled | to_entries | map("\(.key) \(.value.ms) ms in \(.value.periods) periods") | join(", ")); streams: \(.streams.tokens_per_second) tok/s, TTFT p50 \(.streams.ttft.p50_ms / 1000 | r2) s max \(.streams.ttft.max_ms / 1000 | r2) s, \(.streams.requests) done + \(.streams.cut) cut" +
		(if .streams.errors > 0 then ", \(.streams.errors) errors: \(.streams.first_error)" else "" end) +
		(if .long and .long.errors > 0 then "; long prompt errors: \(.long.first_error)" else "" end) +
		(if .remote.ok > 0 then "; \(.remote.ok) remote prefills of \(.remote.tokens) tokens in all, \(.remote.seconds / .remote.ok | r2) s each on average (queueing and KV included; in all: queue \(.remote.phases.queue) s, open \(.remote.phases.open) s, prefill steps \(.remote.phases.step) s, import waits \(.remote.phases.wait) s)" else "" end) +
		(if .remote_alone.tokens > 0 then "; long prompts alone: \(.remote_alone.tokens) tokens remote, \((.remote_alone.payload + .remote_alone.framing) / .remote_alone.tokens | round) B/token on the wire (payload \(.remote_alone.payload / .remote_alone.tokens | round), framing \(100 * .remote_alone.framing / .remote_alone.payload | r2)%)" else "" end)' "$results"
	# (d): which way the rule sent the long prompts, and was it the faster
	# way for them? Remote is what (d) measures; local is (l), the decode
	# device prefilling them itself while it decodes (or (c) for remote
	# when (d) kept them local).
	jq -r -s --arg link "$rate" '
		def r2: . * 100 | round / 100;
		map(select(.link == $link)) | (map(select(.config == "l"))[0]) as $l | (map(select(.config == "c"))[0]) as $c | (map(select(.config == "d"))[0]) as $d |
		if $d == null or $d.long == null then empty else
		($d.remote.ok > 0) as $remote |
		"(d): the routing rule sent \($d.remote.ok + $d.remote.failed) of the \($d.long.requests + $d.long.errors) long prompts of the run to the prefill pool (the streams'"'"' short prompts are under its 1000-token floor), and \($d.remote_alone.ok + $d.remote_alone.failed) of the 2 long prompts sent alone" +
		(if $remote and $l != null and $l.long != null then
			"; remote they took \($d.long.ttft.p50_ms / 1000 | r2) s to the first token (p50), local on the decode device (l) \($l.long.ttft.p50_ms / 1000 | r2) s (\(($d.long.ttft.p50_ms / $l.long.ttft.p50_ms - 1) * 100 | round | if . > 0 then "+\(.)" else "\(.)" end)%); meanwhile the streams ran at \($d.streams.tokens_per_second | r2) tok/s remote, \($l.streams.tokens_per_second | r2) tok/s local (ITL p99 \($d.streams.inter_token.p99_ms | r2) ms, \($l.streams.inter_token.p99_ms | r2) ms): " +
			# As the routing rule weighs it: a local prefill stalls every
			# stream, so the speed of the run is the tokens per second of the streams
			# beside the time of the prompt to its first token.
			(if $d.long.ttft.p50_ms <= $l.long.ttft.p50_ms and $d.streams.tokens_per_second >= $l.streams.tokens_per_second then "remote was the faster way, for the prompt and the streams"
			elif $d.streams.tokens_per_second >= $l.streams.tokens_per_second then "remote was the faster way for the run (the streams), the prompt itself slower"
			else "remote was NOT the faster way" end)
		elif ($remote | not) and $c != null and $c.long != null then
			"; local they took \($d.long.ttft.p50_ms / 1000 | r2) s to the first token (p50), remote (c) \($c.long.ttft.p50_ms / 1000 | r2) s: " +
			(if $d.long.ttft.p50_ms <= $c.long.ttft.p50_ms then "local was the faster way" else "local was NOT the faster way" end)
		else "" end) end' "$results"
	# The targets of the issue.
	jq -r -s --arg link "$rate" '
		def r2: . * 100 | round / 100;
		map(select(.link == $link)) | (map(select(.config == "a"))[0]) as $a | (map(select(.config == "b"))[0]) as $b | (map(select(.config == "c"))[0]) as $c |
		if $a == null or $c == null then empty else
		"targets: (c) ITL p99 / (a) ITL p99 = \($c.streams.inter_token.p99_ms / $a.streams.inter_token.p99_ms | r2) (want <= 1.2)" +
		(if $b != null and $b.long != null and $c.long != null then "; (c) / (b) long TTFT: p50 \($c.long.ttft.p50_ms / $b.long.ttft.p50_ms | r2), max \($c.long.ttft.max_ms / $b.long.ttft.max_ms | r2) (want <= 1)" else "" end) end' "$results"
done
