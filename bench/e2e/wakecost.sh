#!/usr/bin/env bash
# bench/e2e/wakecost.sh: where a server's CPU goes at a fixed rate, kernel
# included. Each server of a finished e2e run is filled, then loaded at RATE
# q/s by dnsperf while perf samples the server (cpu-clock, call graphs), and
# the share of its samples in each part of a query's path is printed: the
# send system call, and within it the wake-up of the client's socket
# (sock_def_readable: the loopback delivers the reply inside the server's
# send, and wakes dnsperf on its core from there); the receive call; the
# wait for the next datagram (epoll_wait, or the socket's own wait in a
# receive that blocks, as the front end's `wait thread` readers do: then
# receive includes it); user space.
#
#   bash bench/e2e/wakecost.sh DIR [RATE [SECONDS]]
#
# DIR is the output directory of an e2e run (bench/e2e/run.sh -out DIR)
# with the default -port; CONFIGS names the servers to look at (default
# "kube-frontend unbound"), each a DIR/CONFIG.Corefile or unbound. Defaults:
# 2,000 q/s, 5 s of samples. Needs perf (Debian's linux-perf) and root
# (SCHED_RR, as -rt-rates). Before the samples, perf counts the server's
# system calls and context switches for as long, with no call graphs to
# collect (whose cost leaves a server behind for a while after): per query,
# at RATE.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir=$(cd "$1" && pwd)
rate=${2:-2000} secs=${3:-5}
read -r -a configs <<<"${CONFIGS:-kube-frontend unbound}"
command -v perf >/dev/null || { echo "wakecost: needs perf (apt-get install linux-perf)" >&2; exit 1; }
out=$(mktemp -d /tmp/compactcache-wakecost-XXXX)
server_core=0 client_core=1 server=15300 upstream=15301
ports_free wakecost $server $upstream
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait' EXIT
taskset -c $client_core "$dir/coredns" -conf "$dir/upstream.Corefile" -quiet >"$out/upstream.log" 2>&1 &
pids+=($!)

# share SYMBOLS: the percentage of the samples whose call chain passes
# through any of SYMBOLS (a grep -E pattern), from perf's children view.
share() {
	perf report -i "$out/perf.data" --children --sort sym --stdio -g none 2>/dev/null |
		awk -v re="$1" '$0 ~ "\\[[k.]\\] [_a-z0-9]*(" re ")$" { if ($1+0 > max) max = $1+0 } END { printf "%5.1f%%", max }'
}

# per_query EVENT FILE: perf stat's count of EVENT in FILE over the
# queries sent meanwhile.
per_query() {
	awk -F, -v ev="$1" -v q=$((rate * secs)) '$3 == ev { printf "%.2f", $1 / q }' "$2"
}

printf '%-16s %8s %8s %10s %8s %8s %8s %10s %10s\n' server send "(wake)" receive wait "user" samples "calls/q" "switches/q"
for c in "${configs[@]}"; do
	if [[ $c == unbound ]]; then
		taskset -c $server_core "$(command -v unbound || echo /usr/sbin/unbound)" -d -c "$dir/unbound.unbound.conf" >"$out/$c.log" 2>&1 &
	else
		taskset -c $server_core "$dir/coredns" -conf "$dir/$c.Corefile" -quiet >"$out/$c.log" 2>&1 &
	fi
	srv=$!
	pids+=($srv)
	sleep 2
	# Fill, so that the sampled queries are hits.
	taskset -c $client_core dnsperf -s 127.0.0.1 -p $server -d "$dir/data/hit.txt" -c 20 -l 8 -Q 20000 >"$out/$c.fill.txt" 2>&1
	chrt -r -p 10 $srv >/dev/null
	chrt -r 10 taskset -c $client_core dnsperf -s 127.0.0.1 -p $server -d "$dir/data/hit.txt" -c 20 -T 1 -q 5000 -Q "$rate" -l $((2 * secs + 2)) >"$out/$c.load.txt" 2>&1 &
	load=$!
	sleep 1
	perf stat -x, -e raw_syscalls:sys_enter,context-switches -p $srv -o "$out/$c.stat" -- sleep "$secs" >/dev/null 2>&1
	perf record -q -e cpu-clock -F 20000 -g -p $srv -o "$out/perf.data" -- sleep "$secs" >/dev/null 2>&1
	wait $load
	samples=$(perf report -i "$out/perf.data" --stdio --sort dso -g none 2>/dev/null | awk '/^# Samples/ { print $3 }')
	user=$(perf report -i "$out/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null |
		awk '/%/ && $2 !~ /kernel/ { s += $1+0 } END { printf "%5.1f%%", s }')
	printf '%-16s %8s %8s %10s %8s %8s %8s %10s %10s\n' "$c" \
		"$(share 'sys_sendmmsg|sys_sendto|sys_sendmsg')" "$(share 'sock_def_readable')" \
		"$(share 'sys_recvmmsg|sys_recvfrom|sys_recvmsg')" "$(share 'do_epoll_wait|__skb_wait_for_more_packets')" "$user" "$samples" \
		"$(per_query raw_syscalls:sys_enter "$out/$c.stat")" "$(per_query context-switches "$out/$c.stat")"
	kill $srv
	wait $srv 2>/dev/null || true
	sleep 6 # CoreDNS's health lameduck
done
# What each of those calls costs on its own here: under a hypervisor that
# takes every system call (a PVM guest's), many times a bare machine's.
echo "a system call on this machine (getppid, perf bench syscall basic): $(perf bench syscall basic -l 1000000 2>/dev/null | awk '/usecs\/op/ { print $1 }') µs"
echo "wakecost: perf data and logs of the last server in $out"
