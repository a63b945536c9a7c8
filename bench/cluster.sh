#!/usr/bin/env bash
# What replication costs: raw 8x16 lock cycles against a single node, the
# active of a two-node cluster, and the same with --semi-sync, interleaved
# (CONNS=1 DEPTH=1 for the round trip of one request at a time).
#   make build && go build -o bin/bench ./bench && bench/cluster.sh [rounds]
set -euo pipefail
KUNCID=${KUNCID:-bin/kuncid}
BENCH=${BENCH:-bin/bench}
ROUNDS=${1:-3}
KEY=$(mktemp)
trap 'rm -f "$KEY"' EXIT
head -c 32 /dev/urandom | base64 >"$KEY"
A=127.0.0.1:7301
B=127.0.0.1:7302

run() {
	local mode=$1 d1 d2 pids=()
	d1=$(mktemp -d) d2=$(mktemp -d)
	case $mode in
	single) "$KUNCID" --listen $A --data-dir "$d1" --log-level error & pids+=($!) ;;
	async | semi)
		local extra=()
		[ "$mode" = semi ] && extra=(--semi-sync)
		"$KUNCID" --listen $A --peers $A,$B --cluster-key-file "$KEY" --data-dir "$d1" --log-level error "${extra[@]}" & pids+=($!)
		"$KUNCID" --listen $B --peers $A,$B --cluster-key-file "$KEY" --data-dir "$d2" --log-level error "${extra[@]}" & pids+=($!)
		;;
	esac
	sleep 2 # node A active, B copied its state
	"$BENCH" --target "kunci://$A" --conns ${CONNS:-8} --depth ${DEPTH:-16} --duration 4s --warmup 1s 2>/dev/null |
		grep -E 'cycles  |latency' | tr -s ' ' | sed "s/^/$mode /"
	# The standby first, so that the active does not try to hand over to it.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	rm -rf "$d1" "$d2"
}

for _ in $(seq "$ROUNDS"); do
	for m in single async semi; do run $m; done
done
