#!/usr/bin/env bash
# bench/e2e/interleave.sh: latency at a fixed rate of the front end
# (kube-frontend) and Unbound, measured in alternating slices so that both
# meet the same host conditions. Both servers run at once on the server
# core, filled once; dnsperf loads one at a time, a slice each in turn, and
# the percentiles are taken over each server's pooled queries.
#
#   bash bench/e2e/interleave.sh DIR [ROUNDS [SECONDS [RATE]]]
#
# DIR is the output directory of an e2e run (bench/e2e/run.sh -out DIR) with
# the default -port that measured kube-frontend and unbound: its binary,
# zone, query files, Corefiles and unbound.conf are used as they are, except
# that Unbound listens on the run's port + 10. Defaults: 10 rounds of 5 s
# slices at 30,000 q/s. Needs root (SCHED_RR), as -rt-rates does.
set -euo pipefail
dir=$(cd "$1" && pwd)
rounds=${2:-10} secs=${3:-5} rate=${4:-30000}
out=$(mktemp -d /tmp/compactcache-interleave-XXXX)
server_core=0 client_core=1
port=15300 uport=15310 upstream=15301

for p in $port $upstream $uport; do
	if ss -Hlun "sport = :$p" | grep -q .; then
		echo "interleave: port $p is in use (a server left from another run?)" >&2
		exit 1
	fi
done
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
start $server_core "$dir/coredns" -conf "$dir/kube-frontend.Corefile" -quiet >"$out/frontend.log" 2>&1
srv=$!
pids+=($srv)
sed -e "s/@$port/@$uport/; s/port: $port/port: $uport/" -e "s#$dir/logs/[^\"]*#$out/unbound.log#" -e "s#\"$dir\"#\"$out\"#; s#$dir/unbound.pid#$out/unbound.pid#" \
	"$dir/unbound.unbound.conf" >"$out/unbound.conf"
start $server_core "$(command -v unbound || echo /usr/sbin/unbound)" -d -c "$out/unbound.conf" >"$out/unbound.out" 2>&1
ub=$!
pids+=($ub)
sleep 2

# dnsperf on the client core, as run.sh runs it; -p names the server.
client=(nice -n -10 taskset -c $client_core dnsperf -s 127.0.0.1 -e -t 3 -c 20 -T 1)
for p in $port $uport; do
	"${client[@]}" -p $p -d "$dir/data/fill.txt" -n 1 -q 100 -l 600 >"$out/fill.$p.txt" 2>&1
	grep "Response codes" "$out/fill.$p.txt"
done
chrt -a -r -p 10 $srv >/dev/null
chrt -a -r -p 10 $ub >/dev/null

cputicks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
: >"$out/frontend.lat"
: >"$out/unbound.lat"
for r in $(seq "$rounds"); do
	for name in frontend unbound; do
		p=$port pid=$srv
		[[ $name == unbound ]] && p=$uport pid=$ub
		c0=$(cputicks $pid)
		chrt -r 10 "${client[@]}" -p $p -d "$dir/data/hit.txt" -q 5000 -Q "$rate" -l "$secs" -v >"$out/slice.txt" 2>&1
		c1=$(cputicks $pid)
		# "> NOERROR name type seconds" per answered query; "> T" a timeout.
		awk '/^> / && $2 != "T" {print $NF * 1e6}' "$out/slice.txt" | sort -g >"$out/slice.lat"
		cat "$out/slice.lat" >>"$out/$name.lat"
		awk -v r=$r -v n=$name -v cpu=$((c1 - c0)) -v hz=$hz <"$out/slice.lat" \
			'{a[NR] = $1} END {printf "round %d %-8s %d answered, p50 %.0f µs, p99 %.0f µs, server %.2f µs/q\n", r, n, NR, a[int(NR * .5)], a[int(NR * .99)], cpu / hz * 1e6 / NR}'
	done
done
for name in frontend unbound; do
	sort -g "$out/$name.lat" | awk -v n=$name \
		'{a[NR] = $1} END {printf "pooled   %-8s %d answered, p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, p99.9 %.0f µs\n", n, NR, a[int(NR * .5)], a[int(NR * .9)], a[int(NR * .99)], a[int(NR * .999)]}'
done
echo "logs in $out"
