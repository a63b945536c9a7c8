#!/usr/bin/env bash
# What TLS costs: one kuncid serving plain TCP and mutual TLS side by side,
# raw lock cycles at 8 conns x 16 in flight and the acquire round trip at
# 1 x 1, each over TCP and over TLS, interleaved round by round (the machine
# is shared: compare figures of one run). Certificates are made with
# openssl, the README's commands, in a temporary directory.
#   make bench-tls (ROUNDS=5), or: make build && go build -o bin/bench ./bench && bench/tls.sh [rounds]
set -euo pipefail
KUNCID=${KUNCID:-bin/kuncid}
BENCH=${BENCH:-bin/bench}
ROUNDS=${1:-3}
DURATION=${DURATION:-4s}
PLAIN=127.0.0.1:7311
TLS=127.0.0.1:7312

dir=$(mktemp -d)
pid=""
cleanup() {
	if [ -n "$pid" ]; then kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; fi
	rm -rf "$dir"
}
trap cleanup EXIT
(
	cd "$dir"
	ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
	openssl req -x509 "${ec[@]}" -days 1 -subj /CN=bench-ca -addext keyUsage=critical,keyCertSign,cRLSign -keyout ca.key -out ca.crt
	openssl req -x509 -CA ca.crt -CAkey ca.key "${ec[@]}" -days 1 -subj /CN=node \
		-addext subjectAltName=IP:127.0.0.1 -addext basicConstraints=critical,CA:FALSE \
		-addext extendedKeyUsage=serverAuth,clientAuth -keyout node.key -out node.crt
	openssl req -x509 -CA ca.crt -CAkey ca.key "${ec[@]}" -days 1 -subj /CN=bench \
		-addext basicConstraints=critical,CA:FALSE -addext extendedKeyUsage=clientAuth \
		-keyout bench.key -out bench.crt
) 2>/dev/null
"$KUNCID" --listen $PLAIN --tls-listen $TLS --tls-cert "$dir/node.crt" --tls-key "$dir/node.key" \
	--tls-client-ca "$dir/ca.crt" --data-dir "" --log-level error &
pid=$!
sleep 1
tlsflags=(--tls-ca "$dir/ca.crt" --tls-cert "$dir/bench.crt" --tls-key "$dir/bench.key")

# run NAME ADDR CONNS DEPTH [FLAGS...]: one bench run, one line:
# NAME cycles/s p50-in-µs node-CPU-µs-per-cycle.
run() {
	local name=$1 addr=$2 conns=$3 depth=$4
	shift 4
	"$BENCH" --target "kunci://$addr" --conns "$conns" --depth "$depth" --duration "$DURATION" \
		--warmup 1s --progress 0 --server-pid "$pid" "$@" 2>/dev/null |
		awk -v n="$name" '
			function us(v) {
				if (v ~ /ms$/) { sub(/ms$/, "", v); return v * 1000 }
				if (v ~ /µs$/) { sub(/µs$/, "", v); return v + 0 }
				if (v ~ /ns$/) { sub(/ns$/, "", v); return v / 1000 }
				sub(/s$/, "", v); return v * 1e6
			}
			/cycles / { c = $6; gsub(",", "", c) }
			/latency/ { p50 = us($3) }
			/server CPU/ { for (i = 1; i <= NF; i++) if ($i == "µs/op") cpu = $(i - 1) }
			END { printf "%s %d %.1f %s\n", n, c, p50, cpu }'
}

results=$dir/results
for r in $(seq "$ROUNDS"); do
	for c in "tcp-8x16 $PLAIN 8 16" "tls-8x16 $TLS 8 16 tls" "tcp-1x1 $PLAIN 1 1" "tls-1x1 $TLS 1 1 tls"; do
		# shellcheck disable=SC2086
		set -- $c
		if [ "${5:-}" = tls ]; then run "$1" "$2" "$3" "$4" "${tlsflags[@]}"; else run "$1" "$2" "$3" "$4"; fi
	done | tee -a "$results" | awk -v r="$r" '
		{ c[$1] = $2; p[$1] = $3; cpu[$1] = $4 }
		END {
			printf "round %d: 8x16 %d cycles/s TCP, %d TLS (%.2f of TCP), node CPU/cycle %s / %s µs; 1x1 p50 %.1f µs TCP, %.1f TLS (%.2fx)\n",
				r, c["tcp-8x16"], c["tls-8x16"], c["tls-8x16"] / c["tcp-8x16"], cpu["tcp-8x16"], cpu["tls-8x16"],
				p["tcp-1x1"], p["tls-1x1"], p["tls-1x1"] / p["tcp-1x1"]
		}'
done
# Medians over the rounds, and the median of the per-round ratios.
awk '
	{
		c[$1] = c[$1] " " $2; p[$1] = p[$1] " " $3; cpu[$1] = cpu[$1] " " $4
		v[$1] = $2; q[$1] = $3; w[$1] = $4
		if (NR % 4 == 0) {
			rc = rc " " v["tls-8x16"] / v["tcp-8x16"]; rw = rw " " w["tls-8x16"] / w["tcp-8x16"]
			rp = rp " " q["tls-1x1"] / q["tcp-1x1"]
		}
	}
	function med(s,   a, n, i, j, t) {
		n = split(s, a, " ")
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	END {
		printf "medians: 8x16 %d cycles/s TCP, %d TLS; node CPU/cycle %.2f / %.2f µs; 1x1 p50 %.1f / %.1f µs\n",
			med(c["tcp-8x16"]), med(c["tls-8x16"]), med(cpu["tcp-8x16"]), med(cpu["tls-8x16"]), med(p["tcp-1x1"]), med(p["tls-1x1"])
		printf "TLS/TCP, median of the rounds: 8x16 cycles/s %.2f, node CPU/cycle %.2f; 1x1 p50 %.2f\n", med(rc), med(rw), med(rp)
	}' "$results"
