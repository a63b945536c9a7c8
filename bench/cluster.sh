#!/usr/bin/env bash
# What replication costs: raw 8x16 lock cycles against a single node, the
# active of a two-node cluster, and the same with --semi-sync, interleaved
# (CONNS=1 DEPTH=1 for the round trip of one request at a time), then the
# medians (min-max) of each case's runs.
#   make build && go build -o bin/bench ./bench && bench/cluster.sh [rounds]
# KUNCIDS="before=/tmp/old/kuncid after=bin/kuncid" runs each case with
# every binary in turn, within each round and in the reverse order every
# other round (a before/after comparison in one run); MODES="semi" runs only some of single, async and semi; PORT moves
# the two nodes' ports (PORT and PORT+1, default 7301).
set -euo pipefail
KUNCIDS=${KUNCIDS:-kuncid=${KUNCID:-bin/kuncid}}
BENCH=${BENCH:-bin/bench}
MODES=${MODES:-single async semi}
ROUNDS=${1:-3}
PORT=${PORT:-7301}
KEY=$(mktemp)
OUT=$(mktemp)
trap 'rm -f "$KEY" "$OUT"' EXIT
head -c 32 /dev/urandom | base64 >"$KEY"
A=127.0.0.1:$PORT
B=127.0.0.1:$((PORT + 1))

run() {
	local label=$1 kuncid=$2 mode=$3 d1 d2 pids=()
	d1=$(mktemp -d) d2=$(mktemp -d)
	case $mode in
	single) "$kuncid" --listen $A --data-dir "$d1" --log-level error & pids+=($!) ;;
	async | semi)
		local extra=()
		[ "$mode" = semi ] && extra=(--semi-sync)
		"$kuncid" --listen $A --peers $A,$B --cluster-key-file "$KEY" --data-dir "$d1" --log-level error "${extra[@]}" & pids+=($!)
		"$kuncid" --listen $B --peers $A,$B --cluster-key-file "$KEY" --data-dir "$d2" --log-level error "${extra[@]}" & pids+=($!)
		;;
	esac
	sleep 2 # node A active, B copied its state
	"$BENCH" --target "kunci://$A" --conns ${CONNS:-8} --depth ${DEPTH:-16} --duration 4s --warmup 1s 2>/dev/null |
		grep -E 'cycles  |latency' | tr -s ' ' | sed "s/^/$label $mode /" | tee -a "$OUT"
	# The standby first, so that the active does not try to hand over to it.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	rm -rf "$d1" "$d2"
}

read -ra bins <<<"$KUNCIDS"
for r in $(seq "$ROUNDS"); do
	for m in $MODES; do
		# Every other round the other way round: no binary always runs first.
		for ((j = 0; j < ${#bins[@]}; j++)); do
			i=$j
			((r % 2)) || i=$((${#bins[@]} - 1 - j))
			kv=${bins[i]}
			run "${kv%%=*}" "${kv#*=}" "$m"
		done
	done
done

# Medians over the rounds: cycles/s and acquire p50 (µs) per binary and case.
echo
echo "binary mode runs: cycles/s median (min-max), p50 µs median (min-max)"
awk '
function us(v) { if (v ~ /ms$/) return v * 1000; if (v ~ /µs$/) return v + 0; if (v ~ /ns$/) return v / 1000; return v * 1e6 }
function med(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
$3 == "cycles" { for (i = 4; i <= NF; i++) if ($i == "cycles/s") { v = $(i-1); gsub(",", "", v); k = $1 " " $2; c[k, ++nc[k]] = v + 0; if (!(k in seen)) { seen[k] = 1; order[++no] = k } } }
$3 == "latency" { k = $1 " " $2; p[k, ++np[k]] = us($5) }
END {
	for (o = 1; o <= no; o++) {
		k = order[o]; n = nc[k]
		delete a; for (i = 1; i <= n; i++) a[i] = c[k, i]; cm = med(a, n); cmin = a[1]; cmax = a[n]
		m = np[k]; delete a; for (i = 1; i <= m; i++) a[i] = p[k, i]; pm = med(a, m); pmin = a[1]; pmax = a[m]
		printf "%s %d: %d (%d-%d), %.1f (%.1f-%.1f)\n", k, n, cm, cmin, cmax, pm, pmin, pmax
	}
}' "$OUT"
