#!/usr/bin/env bash
# bench/compare.sh (make bench-compare): kunci beside the Redis fenced-lock
# recipe, same load, same machine. Starts a kunci node (on a data directory
# of its own, so that it runs beside `make run`) and a redis-server on
# loopback ports, runs every case RUNS times interleaved (round by round,
# every case once a round, kunci then Redis), stops both (also on failure
# or ^C), and prints one table: medians with min–max, and kunci/Redis for
# cycles/s and p99.
#
# It needs redis-server (Redis 6 or newer) on PATH. When it is missing, on
# Debian and Ubuntu (where apt-get exists) the script installs the
# redis-server package with apt-get (through sudo unless run as root); on
# other systems it stops and says so: install Redis yourself (brew install
# redis, dnf install redis, apk add redis, ...). The package's own service
# is not used: the script runs a redis-server of its own, without
# persistence, and stops it at the end.
#
# Settings (environment): RUNS (3; 0 starts both servers, checks them and
# stops: a check of the setup), DURATION (5s), WARMUP (1s),
# EXPIRY_KEYS (100000), KUNCI_ADDR (127.0.0.1:7090), REDIS_PORT (6390),
# OUT (bench-results/<time>), GO (go), KUNCID (a kuncid binary to use;
# default: build bin/kuncid), BENCH (where to build the load client,
# bin/bench).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-3}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-1s}
EXPIRY_KEYS=${EXPIRY_KEYS:-100000}
KUNCI_ADDR=${KUNCI_ADDR:-127.0.0.1:7090}
REDIS_PORT=${REDIS_PORT:-6390}
OUT=${OUT:-bench-results/$(date +%Y%m%d-%H%M%S)}
GO=${GO:-go}
KUNCID=${KUNCID:-}
BENCH=${BENCH:-bin/bench}

log() { printf 'compare: %s\n' "$*" >&2; }

log "kunci on $KUNCI_ADDR beside redis-server on 127.0.0.1:$REDIS_PORT, $RUNS runs of 6 cases (about $((RUNS * 3)) minutes)"
if ! command -v redis-server >/dev/null; then
	if ! command -v apt-get >/dev/null; then
		log "redis-server is not on PATH, and this system has no apt-get to install it with:"
		log "install Redis 6 or newer yourself (brew install redis, dnf install redis, apk add redis, ...) and run again"
		exit 1
	fi
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null || { log "redis-server is missing; installing it needs root: sudo apt-get install redis-server"; exit 1; }
		sudo=sudo
	fi
	log "redis-server is missing: installing the Debian/Ubuntu package redis-server: ${sudo:+$sudo }apt-get update && ${sudo:+$sudo }apt-get install -y redis-server"
	$sudo apt-get update && $sudo apt-get install -y redis-server
fi

# listening HOST PORT: is something accepting connections there?
listening() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

kunci_host=${KUNCI_ADDR%:*}
kunci_port=${KUNCI_ADDR##*:}
for hp in "$kunci_host $kunci_port" "127.0.0.1 $REDIS_PORT"; do
	# shellcheck disable=SC2086
	if listening $hp; then
		log "something already listens on ${hp/ /:}: stop it, or set KUNCI_ADDR / REDIS_PORT"
		exit 1
	fi
done

if [ -z "$KUNCID" ]; then
	KUNCID=bin/kuncid
	$GO build -o "$KUNCID" ./cmd/kuncid
fi
if [ "$RUNS" -gt 0 ]; then $GO build -o "$BENCH" ./bench; fi
tmp=$(mktemp -d)
kunci_pid=""
redis_pid=""

stop_all() {
	local code=$?
	trap - EXIT INT TERM
	if [ -n "$kunci_pid" ]; then kill "$kunci_pid" 2>/dev/null && wait "$kunci_pid" 2>/dev/null || true; fi
	if [ -f "$tmp/redis.pid" ]; then kill "$(cat "$tmp/redis.pid")" 2>/dev/null || true; fi
	if [ -n "$redis_pid" ]; then
		for _ in $(seq 50); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
	fi
	rm -rf "$tmp"
	exit "$code"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# A data directory of its own: ./kunci-data is make run's, locked while it
# runs. KUNCI_ADDR is this script's setting, not kuncid's (which refuses a
# KUNCI_ variable it does not know).
env -u KUNCI_ADDR "$KUNCID" --listen "$KUNCI_ADDR" --data-dir "$tmp/kunci-data" --log-level warn >"$tmp/kuncid.log" 2>&1 &
kunci_pid=$!
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
	--daemonize yes --pidfile "$tmp/redis.pid" --logfile "$tmp/redis.log" --dir "$tmp"
for _ in $(seq 100); do
	if listening "$kunci_host" "$kunci_port" && listening 127.0.0.1 "$REDIS_PORT" && [ -s "$tmp/redis.pid" ]; then break; fi
	sleep 0.1
done
listening "$kunci_host" "$kunci_port" || { log "kuncid did not start:"; cat "$tmp/kuncid.log" >&2; exit 1; }
listening 127.0.0.1 "$REDIS_PORT" || { log "redis-server did not start:"; cat "$tmp/redis.log" >&2; exit 1; }
redis_pid=$(cat "$tmp/redis.pid")
log "kunci $("$KUNCID" --version) on $KUNCI_ADDR (pid $kunci_pid), $(redis-server --version | cut -d' ' -f1-3) on 127.0.0.1:$REDIS_PORT (pid $redis_pid)"
if [ "$RUNS" -eq 0 ]; then
	log "RUNS=0: both servers answer; stopping"
	exit 0
fi
mkdir -p "$OUT"
log "$RUNS interleaved runs per case, window $DURATION after $WARMUP warm-up; results in $OUT"

# Cases: label | flags (both sides get the same flags).
cases=(
	"uncontended raw 8×16|--mode raw --conns 8 --depth 16 --workload uncontended"
	"uncontended client 8 conns × 256 goroutines|--mode client --conns 8 --depth 32 --workload uncontended"
	"uncontended raw 50×16|--mode raw --conns 50 --depth 16 --workload uncontended"
	"uncontended raw 1×1|--mode raw --conns 1 --depth 1 --workload uncontended"
	"contended 50 clients on 1 key|--mode raw --conns 50 --depth 1 --workload contended --keys 1"
	"expiry $EXPIRY_KEYS leases of 1s|--mode raw --conns 8 --depth 16 --workload expiry --keys $EXPIRY_KEYS --lease 1s"
)

# Round by round: every case once per round, so that each case's runs are
# spread over the whole comparison and cases compared with each other (the
# client library against the raw protocol) meet the machine in the same
# moods.
for run in $(seq "$RUNS"); do
	n=0
	for c in "${cases[@]}"; do
		n=$((n + 1))
		label=${c%%|*}
		read -r -a flags <<<"${c#*|}"
		window=(--duration "$DURATION" --warmup "$WARMUP")
		if [[ " ${flags[*]} " == *" expiry "* ]]; then window=(--duration 60s); fi
		for side in kunci redis; do
			if [ "$side" = kunci ]; then
				target="kunci://$KUNCI_ADDR" pid=$kunci_pid
			else
				target="redis://127.0.0.1:$REDIS_PORT" pid=$redis_pid
			fi
			base=$(printf '%s/%02d.%d.%s' "$OUT" "$n" "$run" "$side")
			"$BENCH" --target "$target" "${flags[@]}" "${window[@]}" --server-pid "$pid" \
				--label "$label" --json "$base.json" --progress 0 >"$base.txt"
			log "$label, $side run $run: $(grep -E '^  (cycles|leases) ' "$base.txt" | sed 's/^ *//')"
		done
	done
done

"$BENCH" table "$OUT"/*.json | tee "$OUT/table.md"
