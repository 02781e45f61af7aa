#!/usr/bin/env bash
# bench/e2e/run.sh: the end-to-end benchmark of the custom CoreDNS build,
# compactcache (plain and with its front end) beside the stock cache and
# Unbound as a caching forwarder, over UDP on 127.0.0.1 with dnsperf.
#
#   bash bench/e2e/run.sh                   # the full run: about 25 minutes
#   bash bench/e2e/run.sh -n 20000 -duration 5s -profiles ''   # a quick look
#   bash bench/e2e/run.sh -rev HEAD -rounds 3 -rt-rates          # a commit, 3 rounds, medians
#   bash bench/e2e/run.sh -from DIR/results.json                 # an earlier run's tables
#   bash bench/e2e/run.sh -h                # every flag
#
# It installs what it needs (dnsperf, unbound, and taskset/chrt from
# util-linux, from Debian's packages, as root), then runs `go run ./bench/e2e` with the flags
# given, which builds cmd/coredns, writes the zone of the reference workload,
# serves it from a second CoreDNS process (file plugin), measures each server
# in turn and prints the tables (also written to results.md and results.json
# in the output directory it names). Loopback only; bounded by -duration per
# phase and -timeout for the run. See bench/e2e/RESULTS.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

need=()
command -v dnsperf >/dev/null || need+=(dnsperf)
# Unbound for the unbound config, run by the tool with its own unbound.conf.
# Where the package starts its system service (policy-rc.d permitting), that
# one listens on port 53 and stays out of the run.
{ command -v unbound || [[ -x /usr/sbin/unbound ]]; } >/dev/null || need+=(unbound)
{ command -v taskset && command -v chrt; } >/dev/null || need+=(util-linux)
if ((${#need[@]})); then
	if [[ $(id -u) != 0 ]]; then
		echo "run.sh: needs ${need[*]} (apt-get install -y ${need[*]}) and is not root" >&2
		exit 1
	fi
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi
if (($(nproc) < 2)); then
	echo "run.sh: needs 2 CPUs: one for the server, one for dnsperf" >&2
	exit 1
fi

exec go run ./bench/e2e "$@"
