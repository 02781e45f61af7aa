#!/usr/bin/env bash
# bench/e2e/interleave.sh: servers of a finished e2e run measured in
# alternating slices, so that all meet the same host conditions. The
# servers run at once on the server core, filled once; dnsperf loads one at
# a time, a slice each in turn. At a fixed rate it prints each slice's
# latency and the percentiles over each server's pooled queries; at max,
# each slice's throughput. Both print the server's CPU per query, slice by
# slice and as the median over slices of each server's difference from the
# first server's CPU in the same round.
#
#   bash bench/e2e/interleave.sh DIR [ROUNDS [SECONDS [RATE]]]
#
# DIR is the output directory of an e2e run (bench/e2e/run.sh -out DIR) with
# the default -port that measured the configs to compare: its binary, zone,
# query files, Corefiles and unbound.conf are used as they are, except for
# their ports. CONFIGS names them (default "kube-frontend unbound"): each a
# CoreDNS config whose DIR/CONFIG.Corefile exists, served by DIR/CONFIG.coredns
# where that exists (another build), else DIR/coredns; or unbound. RATE is a
# rate in q/s or "max" (dnsperf -q 200, as run.sh's max phase). Defaults:
# 10 rounds of 5 s slices at 30,000 q/s. Needs root (SCHED_RR), as
# -rt-rates does.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir=$(cd "$1" && pwd)
rounds=${2:-10} secs=${3:-5} rate=${4:-30000}
read -r -a configs <<<"${CONFIGS:-kube-frontend unbound}"
out=$(mktemp -d /tmp/compactcache-interleave-XXXX)
server_core=0 client_core=1
# The run's ports: base the server's, base+1 and base+2 the upstream's,
# base+3 to base+7 those of the server's other listeners. The i-th config
# takes them shifted by 20*i; the upstream is shared.
base=15300 upstream=15301

declare -A port pid
i=0
for c in "${configs[@]}"; do
	[[ -v "port[$c]" ]] && { echo "interleave: $c named twice" >&2; exit 1; }
	[[ $c == unbound || -f $dir/$c.Corefile ]] || { echo "interleave: no $dir/$c.Corefile" >&2; exit 1; }
	port[$c]=$((base + 20 * i))
	i=$((i + 1))
done
ports_free interleave $upstream "${port[@]}"
pids=()
# The servers stop on exit; CoreDNS's health lameduck holds it 5 s more.
trap 'kill "${pids[@]}" 2>/dev/null || true; wait' EXIT
# start CORE CMD...: CMD in the background on CORE; $! is its pid, not a
# subshell's, for chrt and /proc/PID/stat.
start() {
	local core=$1
	shift
	nice -n -10 taskset -c "$core" "$@" &
}

start $client_core "$dir/coredns" -conf "$dir/upstream.Corefile" -quiet >"$out/upstream.log" 2>&1
pids+=($!)
head -1 "$dir/data/fill.txt" >"$out/probe.txt"
for _ in $(seq 100); do # until the upstream has loaded its zone
	dnsperf -s 127.0.0.1 -p $upstream -d "$out/probe.txt" -n 1 -t 1 2>/dev/null | grep -q 'NOERROR 1 ' && break
	sleep 0.3
done
for c in "${configs[@]}"; do
	p=${port[$c]}
	if [[ $c == unbound ]]; then
		sed -e "s/@$base/@$p/; s/port: $base/port: $p/" -e "s#$dir/logs/[^\"]*#$out/unbound.log#" -e "s#\"$dir\"#\"$out\"#; s#$dir/unbound.pid#$out/unbound.pid#" \
			"$dir/unbound.unbound.conf" >"$out/unbound.conf"
		start $server_core "$(command -v unbound || echo /usr/sbin/unbound)" -d -c "$out/unbound.conf" >"$out/unbound.out" 2>&1
	else
		shift=()
		for d in 0 3 4 5 6 7; do
			shift+=(-e "s/:$((base + d))\b/:$((p + d))/g")
		done
		sed "${shift[@]}" "$dir/$c.Corefile" >"$out/$c.Corefile"
		bin=$dir/coredns
		[[ -x $dir/$c.coredns ]] && bin=$dir/$c.coredns
		start $server_core "$bin" -conf "$out/$c.Corefile" -quiet >"$out/$c.log" 2>&1
	fi
	pid[$c]=$!
	pids+=($!)
done
sleep 2

# dnsperf on the client core, as run.sh runs it; -p names the server.
client=(nice -n -10 taskset -c $client_core dnsperf -s 127.0.0.1 -e -t 3 -c 20 -T 1)
for c in "${configs[@]}"; do
	"${client[@]}" -p "${port[$c]}" -d "$dir/data/fill.txt" -n 1 -q 100 -l 600 >"$out/fill.$c.txt" 2>&1
	echo "fill $c: $(grep "Response codes" "$out/fill.$c.txt")"
	chrt -a -r -p 10 "${pid[$c]}" >/dev/null
done

load=(-q 5000 -Q "$rate" -v)
[[ $rate == max ]] && load=(-q 200)
cputicks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# pct(P) of sorted latencies, one a line: the nearest rank, as run.sh's
# tables take it (percentile in dnsperf.go).
pct='{a[NR] = $1}
function pct(p, rank) {
	rank = p * NR / 100 - 1e-9
	rank = rank == int(rank) ? rank : int(rank) + 1
	return a[rank < 1 ? 1 : rank > NR ? NR : rank]
}'
hz=$(getconf CLK_TCK)
for c in "${configs[@]}"; do : >"$out/$c.lat"; done
: >"$out/cpu.txt"
for r in $(seq "$rounds"); do
	for c in "${configs[@]}"; do
		c0=$(cputicks "${pid[$c]}")
		chrt -r 10 "${client[@]}" -p "${port[$c]}" -d "$dir/data/hit.txt" "${load[@]}" -l "$secs" >"$out/slice.txt" 2>&1
		c1=$(cputicks "${pid[$c]}")
		n=$(awk '/Queries completed:/ {print $3}' "$out/slice.txt")
		cpu=$(awk -v t=$((c1 - c0)) -v hz="$hz" -v n="$n" 'BEGIN {printf "%.2f", t / hz * 1e6 / n}')
		echo "$r $c $cpu" >>"$out/cpu.txt"
		if [[ $rate == max ]]; then
			qps=$(awk '/Queries per second:/ {printf "%.0f", $4}' "$out/slice.txt")
			printf 'round %d %-20s %d answered, %s q/s, server %s µs/q\n' "$r" "$c" "$n" "$qps" "$cpu"
			continue
		fi
		# "> NOERROR name type seconds" per answered query; "> T" a timeout.
		awk '/^> / && $2 != "T" {print $NF * 1e6}' "$out/slice.txt" | sort -g >"$out/slice.lat"
		cat "$out/slice.lat" >>"$out/$c.lat"
		awk -v r="$r" -v c="$c" -v cpu="$cpu" "$pct"'
			END {printf "round %d %-20s %d answered, p50 %.0f µs, p99 %.0f µs, server %s µs/q\n", r, c, NR, pct(50), pct(99), cpu}' "$out/slice.lat"
	done
done
if [[ $rate != max ]]; then
	for c in "${configs[@]}"; do
		sort -g "$out/$c.lat" | awk -v c="$c" "$pct"'
			END {printf "pooled   %-20s %d answered, p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, p99.9 %.0f µs\n", c, NR, pct(50), pct(90), pct(99), pct(99.9)}'
	done
fi
# Each config's CPU per query less the first config's in the same round,
# the median over rounds (the mean of the middle two for an even count).
for c in "${configs[@]:1}"; do
	awk -v first="${configs[0]}" -v c="$c" '$2 == first {f[$1] = $3} $2 == c {v[$1] = $3}
		END {for (r in v) print v[r] - f[r]}' "$out/cpu.txt" | sort -g |
		awk -v first="${configs[0]}" -v c="$c" '{d[NR] = $1; if ($1 < 0) lower++}
			END {m = NR % 2 ? d[(NR + 1) / 2] : (d[NR / 2] + d[NR / 2 + 1]) / 2
			printf "cpu      %-20s %+.2f µs/q against %s, median of %d rounds (lower in %d)\n", c, m, first, NR, lower}'
done
echo "logs in $out"
