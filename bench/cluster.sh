#!/usr/bin/env bash
# What replication costs: raw 8x16 lock cycles against a single node, the
# active of a cluster (asynchronous), and the same with --semi-sync,
# interleaved (CONNS=1 DEPTH=1 for the round trip of one request at a time),
# then the medians (min-max) of each case's runs: cycles/s, acquire p50, the
# active's CPU per cycle and the standbys' (each, from /proc), and each
# case's ratios to the single node of the same binary, round by round.
#   make build && go build -o bin/bench ./bench && bench/cluster.sh [rounds]
# KUNCIDS="before=/tmp/old/kuncid after=bin/kuncid" runs each case with
# every binary in turn, within each round and in the reverse order every
# other round (a before/after comparison in one run); MODES="semi" runs only
# some of single, async and semi; NODES sets the cluster's size (2, the
# default, or 3: two standbys); PORT moves the nodes' ports (PORT, PORT+1,
# …, default 7301). MODES may add echo and relay, run once a round whatever
# KUNCIDS says, under the label gnet: bench/echo alone, and bench/echo with
# --relay in front of a second one (one extra loopback round trip through
# gnet and nothing else); relay's ratio is to echo of the same round, the
# floor of semi's acquire p50 ratio (ECHO names the binary, bin/echo).
# PIN=1 runs the single node or the active (and the echo server) on CPU 0
# and everything else (the load, the standbys, the relay) on CPU 1: the
# active's cost with a core of its own, as where its standbys run on other
# machines.
set -euo pipefail
KUNCIDS=${KUNCIDS:-kuncid=${KUNCID:-bin/kuncid}}
BENCH=${BENCH:-bin/bench}
ECHO=${ECHO:-bin/echo}
MODES=${MODES:-single async semi}
NODES=${NODES:-2}
ROUNDS=${1:-3}
PORT=${PORT:-7301}
PIN=${PIN:-}
# on CPU command… runs command on CPU 0 (the node measured) or 1 (the
# rest) when PIN is set, in place of the shell: called with &, $! is the
# command's pid.
on() {
	local cpu=$1
	shift
	if [ -n "$PIN" ]; then
		exec taskset -c "$cpu" "$@"
	fi
	exec "$@"
}
KEY=$(mktemp)
OUT=$(mktemp)
trap 'rm -f "$KEY" "$OUT"' EXIT
head -c 32 /dev/urandom | base64 >"$KEY"
addrs=()
for ((i = 0; i < NODES; i++)); do addrs+=("127.0.0.1:$((PORT + i))"); done
A=${addrs[0]}
PEERS=$(IFS=,; echo "${addrs[*]}")

# ticks prints the CPU time (user+system, in clock ticks) of a process;
# syscalls its read and write system calls so far (reads, then writes).
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
syscalls() { awk '$1 == "syscr:" { r = $2 } $1 == "syscw:" { w = $2 } END { print r, w }' "/proc/$1/io"; }

run() {
	local label=$1 kuncid=${2%%:*} mode=$3 dirs=() pids=() n=1 i load=()
	[ "$2" != "$kuncid" ] && read -ra load <<<"${2#*:}"

	case $mode in
	single)
		dirs+=("$(mktemp -d)")
		on 0 "$kuncid" --listen "$A" --data-dir "${dirs[0]}" --log-level error & pids+=($!)
		;;
	async | semi)
		local extra=()
		[ "$mode" = semi ] && extra=(--semi-sync)
		n=$NODES
		for ((i = 0; i < n; i++)); do
			dirs+=("$(mktemp -d)")
			on $((i > 0)) "$kuncid" --listen "${addrs[i]}" --peers "$PEERS" --cluster-key-file "$KEY" --data-dir "${dirs[i]}" --log-level error "${extra[@]}" & pids+=($!)
		done
		;;
	echo)
		on 0 "$ECHO" --listen "$A" & pids+=($!)
		;;
	relay)
		n=2
		on 1 "$ECHO" --listen "${addrs[1]}" & local up=$!
		sleep 0.5
		on 0 "$ECHO" --listen "$A" --relay "${addrs[1]}" & pids+=($! "$up")
		;;
	esac
	sleep 2 # node A active, the standbys copied its state
	on 1 "$BENCH" --target "kunci://$A" --server-pid "${pids[0]}" --conns ${CONNS:-8} --depth ${DEPTH:-16} --duration 4s --warmup 1s "${load[@]}" >"$OUT.run" 2>/dev/null &
	local bp=$! t0 t1 c0=() c1=() io0=() io1=() a0 a1
	sleep 1 # the warm-up
	t0=$(date +%s.%N)
	a0=$(syscalls "${pids[0]}")
	for ((i = 1; i < n; i++)); do c0+=("$(ticks "${pids[i]}")") io0+=("$(syscalls "${pids[i]}")"); done
	wait $bp
	t1=$(date +%s.%N)
	a1=$(syscalls "${pids[0]}")
	for ((i = 1; i < n; i++)); do c1+=("$(ticks "${pids[i]}")") io1+=("$(syscalls "${pids[i]}")"); done
	# The standbys' CPU as a share of one core over the window, per standby.
	local sb=0
	for ((i = 1; i < n; i++)); do
		sb=$(awk -v a="${c0[i - 1]}" -v b="${c1[i - 1]}" -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" -v s="$sb" -v k=$((n - 1)) 'BEGIN { print s + (b - a) / hz / (t1 - t0) / k }')
	done
	grep -E 'cycles  |latency|server CPU' "$OUT.run" | tr -s ' ' | sed "s/^/$label $mode /" | tee -a "$OUT"
	echo "$label $mode standby $sb" | tee -a "$OUT"
	# The node's (the active's) reads and writes per second over the window.
	read -r r0 w0 <<<"$a0"
	read -r r1 w1 <<<"$a1"
	awk -v r=$((r1 - r0)) -v w=$((w1 - w0)) -v t0="$t0" -v t1="$t1" -v l="$label $mode" \
		'BEGIN { printf "%s node-io %.0f reads/s %.0f writes/s\n", l, r / (t1 - t0), w / (t1 - t0) }' | tee -a "$OUT"
	# A standby's reads (about one a batch of the stream) and writes (its
	# acknowledgements, and its heartbeats) per second, over the window.
	if ((n > 1)); then
		read -r r0 w0 <<<"${io0[0]}"
		read -r r1 w1 <<<"${io1[0]}"
		awk -v r=$((r1 - r0)) -v w=$((w1 - w0)) -v t0="$t0" -v t1="$t1" -v l="$label $mode" \
			'BEGIN { printf "%s standby-io %.0f reads/s %.0f writes/s\n", l, r / (t1 - t0), w / (t1 - t0) }' | tee -a "$OUT"
	fi
	# The standbys first, so that the active does not try to hand over to one.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	rm -rf "${dirs[@]}" "$OUT.run"
}

read -ra bins <<<"$KUNCIDS"
for r in $(seq "$ROUNDS"); do
	for m in $MODES; do
		if [ "$m" = echo ] || [ "$m" = relay ]; then
			run gnet "" "$m"
			continue
		fi
		# Every other round the other way round: no binary always runs first.
		for ((j = 0; j < ${#bins[@]}; j++)); do
			i=$j
			((r % 2)) || i=$((${#bins[@]} - 1 - j))
			kv=${bins[i]}
			run "${kv%%=*}" "${kv#*=}" "$m"
		done
	done
done

# Medians over the rounds, per binary and case: cycles/s, acquire p50 (µs),
# the active's CPU per cycle (µs) and each standby's (its CPU share over the
# window divided by the cycles/s of the run); then, per binary, the medians
# of each round's ratios to that round's single node (the machine's load
# drifts between rounds more than within one).
echo
echo "binary mode runs: cycles/s median (min-max), p50 µs median (min-max), active µs/cycle, standby µs/cycle (then, for a cluster, the first standby's reads/s and writes/s)"
awk '
function us(v) { if (v ~ /ms$/) return v * 1000; if (v ~ /µs$/) return v + 0; if (v ~ /ns$/) return v / 1000; return v * 1e6 }
function med(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
function min2(x, y) { return x < y ? x : y }
function median(arr, k, n,   i, a) { for (i = 1; i <= n; i++) a[i] = arr[k, i]; return med(a, n) }
$3 == "cycles" { for (i = 4; i <= NF; i++) if ($i == "cycles/s") { v = $(i-1); gsub(",", "", v); k = $1 " " $2; c[k, ++nc[k]] = v + 0; last[k] = v + 0; if (!(k in seen)) { seen[k] = 1; order[++no] = k } } }
$3 == "latency" { k = $1 " " $2; p[k, ++np[k]] = us($5) }
$3 == "server" { k = $1 " " $2; for (i = 4; i <= NF; i++) if ($i == "µs/op") a[k, ++na[k]] = $(i-1) + 0 }
$3 == "standby" { k = $1 " " $2; s[k, ++ns[k]] = (last[k] > 0 ? $4 * 1e6 / last[k] : 0) }
$3 == "standby-io" { k = $1 " " $2; rd[k, ++nio[k]] = $4; wr[k, nio[k]] = $6 }
END {
	for (o = 1; o <= no; o++) {
		k = order[o]; n = nc[k]
		delete x; for (i = 1; i <= n; i++) x[i] = c[k, i]; cm[k] = med(x, n); cmin = x[1]; cmax = x[n]
		m = np[k]; delete x; for (i = 1; i <= m; i++) x[i] = p[k, i]; pm = med(x, m); pmin = x[1]; pmax = x[m]
		am[k] = na[k] ? median(a, k, na[k]) : 0
		sm[k] = ns[k] ? median(s, k, ns[k]) : 0
		io = nio[k] ? sprintf(", %.0f, %.0f", median(rd, k, nio[k]), median(wr, k, nio[k])) : ""
		printf "%s %d: %d (%d-%d), %.1f (%.1f-%.1f), %.2f, %.2f%s\n", k, n, cm[k], cmin, cmax, pm, pmin, pmax, am[k], sm[k], io
	}
	print ""
	print "binary mode: medians over the rounds of the ratio to the single node (relay: to echo) in the same round: cycles/s, active CPU/cycle, standby CPU/cycle vs single CPU/cycle, acquire p50 (then the p50 ratio of each round)"
	for (o = 1; o <= no; o++) {
		k = order[o]; split(k, kk, " "); b = kk[1] (kk[2] == "relay" ? " echo" : " single")
		if (kk[2] == "single" || kk[2] == "echo" || !(b in cm)) continue
		n = min2(nc[k], nc[b]); m = min2(min2(na[k], na[b]), ns[k])
		delete x; for (i = 1; i <= n; i++) x[i] = c[k, i] / c[b, i]; rc = med(x, n)
		delete x; for (i = 1; i <= m; i++) x[i] = a[k, i] / a[b, i]; ra = m ? med(x, m) : 0
		delete x; for (i = 1; i <= m; i++) x[i] = s[k, i] / a[b, i]; rs = m ? med(x, m) : 0
		l = min2(np[k], np[b]); rounds = ""
		delete x; for (i = 1; i <= l; i++) { x[i] = p[k, i] / p[b, i]; rounds = rounds sprintf(" %.2f", x[i]) }
		rp = l ? med(x, l) : 0
		printf "%s: %.2f, %.2f, %.2f, %.2f (rounds%s)\n", k, rc, ra, rs, rp, rounds
	}
}' "$OUT"
