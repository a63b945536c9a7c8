#!/usr/bin/env bash
# A node beside the network's ceiling: raw uncontended lock cycles (50x16 by
# default) against kuncid (default flags: one loop, one shard, a data
# directory of its own) and against bench/echo, a bare gnet server with
# kuncid's loop settings that answers each line with a line of the size
# kunci's answer has, round by round, each server started afresh for its
# run. It prints each run, then per server the medians (min-max) of
# cycles/s and of the server's and the load client's CPU per cycle (from
# /proc), then per kuncid the medians of each round's ratios to the echo
# server of the same round: cycles/s (issue 21's row) and CPU per cycle.
#   make build && go build -o bin/bench ./bench && go build -o bin/echo ./bench/echo
#   bench/ceiling.sh [rounds]          # 5 by default
# KUNCIDS="before=/tmp/old/kuncid after=bin/kuncid" runs every binary in
# each round (a before/after comparison in one run); the order of the
# servers is reversed every other round. SPINS="100ns 200ns" adds echo
# servers that burn that much CPU per answer (echo --spin): what a node's
# own work per request costs in cycles/s. CONNS, DEPTH (50, 16), DURATION
# (4s), WARMUP (1s) and PORT (7381) change the load and the port.
set -euo pipefail
KUNCIDS=${KUNCIDS:-kuncid=${KUNCID:-bin/kuncid}}
BENCH=${BENCH:-bin/bench}
ECHO=${ECHO:-bin/echo}
ROUNDS=${1:-5}
PORT=${PORT:-7381}
ADDR=127.0.0.1:$PORT
OUT=$(mktemp)
DIR=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null
	rm -rf "$OUT" "$OUT.run" "$DIR"
}
trap cleanup EXIT

# up waits until something accepts connections on ADDR.
up() {
	for _ in $(seq 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0
		sleep 0.05
	done
	echo "ceiling.sh: nothing listens on $ADDR" >&2
	return 1
}

run() {
	local label=$1 bin=$2
	if [ "$label" = echo ]; then
		"$bin" --listen "$ADDR" & pid=$!
	elif [ "${label#echo+}" != "$label" ]; then
		"$bin" --listen "$ADDR" --spin "${label#echo+}" & pid=$!
	else
		rm -rf "$DIR/data"
		"$bin" --listen "$ADDR" --data-dir "$DIR/data" --log-level error & pid=$!
	fi
	up
	"$BENCH" --target "kunci://$ADDR" --server-pid "$pid" --conns "${CONNS:-50}" --depth "${DEPTH:-16}" \
		--duration "${DURATION:-4s}" --warmup "${WARMUP:-1s}" >"$OUT.run" 2>/dev/null
	grep -E 'cycles  |client CPU|server CPU' "$OUT.run" | tr -s ' ' | sed "s/^/$r $label /" | tee -a "$OUT"
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	pid=
}

spins=
for d in ${SPINS:-}; do spins+=" echo+$d=$ECHO"; done
read -ra servers <<<"echo=$ECHO$spins $KUNCIDS"
for r in $(seq "$ROUNDS"); do
	for ((j = 0; j < ${#servers[@]}; j++)); do
		i=$j
		((r % 2)) || i=$((${#servers[@]} - 1 - j))
		kv=${servers[i]}
		run "${kv%%=*}" "${kv#*=}"
	done
done

# Lines: round label cycles|client|server … ; the medians, then each
# round's ratio to the echo run of the same round.
echo
echo "server runs: cycles/s median (min-max); server µs/cycle median (min-max); client µs/cycle median"
awk '
function med(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
function perop(   i) { for (i = 4; i <= NF; i++) if ($i == "µs/op") return $(i-1) + 0; return 0 }
$3 == "cycles" { for (i = 4; i <= NF; i++) if ($i == "cycles/s") { v = $(i-1); gsub(",", "", v); c[$2, $1] = v + 0 }
	if (!($2 in seen)) { seen[$2] = 1; order[++no] = $2 } rounds[$1] = 1 }
$3 == "server" { s[$2, $1] = perop() }
$3 == "client" { k[$2, $1] = perop() }
END {
	for (o = 1; o <= no; o++) {
		l = order[o]; n = 0; delete x; delete y; delete z
		for (r in rounds) if ((l, r) in c) { n++; x[n] = c[l, r]; y[n] = s[l, r]; z[n] = k[l, r] }
		cm = med(x, n); cmin = x[1]; cmax = x[n]
		sm = med(y, n); smin = y[1]; smax = y[n]
		printf "%s %d: %d (%d-%d); %.2f (%.2f-%.2f); %.2f\n", l, n, cm, cmin, cmax, sm, smin, smax, med(z, n)
	}
	print ""
	print "each server vs echo, round by round (cycles/s ratio, server CPU/cycle ratio), then the medians"
	for (o = 1; o <= no; o++) {
		l = order[o]; if (l == "echo") continue
		n = 0; delete x; delete y; line = ""
		for (r = 1; (r in rounds); r++) {
			if (!((l, r) in c) || !(("echo", r) in c)) continue
			n++; x[n] = c[l, r] / c["echo", r]; y[n] = s["echo", r] > 0 ? s[l, r] / s["echo", r] : 0
			line = line sprintf(" %.2f/%.2f", x[n], y[n])
		}
		printf "%s:%s  median %.2f, %.2f\n", l, line, med(x, n), med(y, n)
	}
}' "$OUT"
