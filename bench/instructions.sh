#!/usr/bin/env bash
# Instructions a 50x16 lock cycle costs a whole kuncid process, user space,
# counted by callgrind: exact where /proc's CPU time wanders ±15 % from one
# round to the next on a shared machine, so a change of a few percent shows.
# The node runs under valgrind; bench sends WARM cycles, callgrind's counters
# are dumped and reset, bench sends CYCLES more, and the second dump divided
# by CYCLES is printed. STANDBYS=2 measures the active of a three-node
# asynchronous cluster instead (its standbys run outside valgrind). Bench
# flags follow the binary:
#   make build && bench/instructions.sh bin/kuncid [--session 7]
# Needs valgrind (callgrind_control, callgrind_annotate). Takes a few
# minutes: valgrind runs the node some fifty times slower.
set -euo pipefail
KUNCID=${1:?usage: bench/instructions.sh KUNCID [bench flags]}
shift
BENCH=${BENCH:-bin/bench}
STANDBYS=${STANDBYS:-0}
WARM=${WARM:-40000}
CYCLES=${CYCLES:-200000}
PORT=${PORT:-7355}

dir=$(mktemp -d)
pids=()
cleanup() {
	kill -9 "${pids[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

common=(--log-level error)
if [ "$STANDBYS" -gt 0 ]; then
	peers=127.0.0.1:$PORT
	for i in $(seq "$STANDBYS"); do peers+=,127.0.0.1:$((PORT + i)); done
	head -c 32 /dev/urandom | base64 >"$dir/key"
	chmod 600 "$dir/key"
	# A long failover timeout: the active under valgrind is slow to beat.
	common+=(--peers "$peers" --cluster-key-file "$dir/key" --failover-timeout 20s --heartbeat 200ms)
fi
GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file="$dir/cg" \
	"$KUNCID" --listen 127.0.0.1:$PORT --data-dir "$dir/0" "${common[@]}" >"$dir/valgrind.log" 2>&1 &
pids+=($!)
node=$!
sleep 3 # the standbys come after the first node, so that it is the active
for i in $(seq "$STANDBYS"); do
	"$KUNCID" --listen 127.0.0.1:$((PORT + i)) --data-dir "$dir/$i" "${common[@]}" >/dev/null 2>&1 &
	pids+=($!)
done

info() { (exec 3<>/dev/tcp/127.0.0.1/"$1" && echo I >&3 && timeout 2 head -n1 <&3) 2>/dev/null || true; }
ready() {
	[[ "$(info $PORT)" == "I active"* ]] || return 1
	for i in $(seq "$STANDBYS"); do
		[[ "$(info $((PORT + i)))" == "I standby"* ]] || return 1
	done
}
for _ in $(seq 240); do
	ready && break
	sleep 0.5
done
ready || { echo "the node did not come up:" >&2; cat "$dir/valgrind.log" >&2; exit 1; }
sleep 2 # the standbys' snapshots

# dump has callgrind write its counters (and reset them) and prints the
# instructions since the last dump.
dump() {
	callgrind_control -d "$node" >/dev/null 2>&1
	sleep 1
	callgrind_annotate "$(ls -t "$dir"/cg.* | head -1)" 2>/dev/null |
		awk '/PROGRAM TOTALS/ && !done { gsub(",", "", $1); print $1; done = 1 }'
}
run() {
	local ops=$1
	shift
	"$BENCH" --target kunci://127.0.0.1:$PORT --conns 50 --depth 16 --ops "$ops" --warmup 0 \
		--duration 600s --progress 0 "$@" >"$dir/bench.out" 2>&1 ||
		{ cat "$dir/bench.out" >&2; exit 1; }
	grep -q "errors *none" "$dir/bench.out" || { cat "$dir/bench.out" >&2; exit 1; }
}
run "$WARM" "$@"
dump >/dev/null
run "$CYCLES" "$@"
total=$(dump)
echo "$(basename "$KUNCID")${*:+ $*}: $((total / CYCLES)) instructions a cycle ($total over $CYCLES cycles, standbys $STANDBYS)"
