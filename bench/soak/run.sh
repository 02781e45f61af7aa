#!/usr/bin/env bash
# bench/soak/run.sh: the soak test of the custom CoreDNS build with
# compactcache: 10 minutes of dnsperf load on 127.0.0.1 with a working set
# several times the cache's budget; RSS, answered q/s, lost queries and error
# rcodes sampled every 10 s into bench/soak/soak.csv, drawn into
# bench/soak/soak.png.
#
#   bash bench/soak/run.sh                            # the full run: about 11 minutes
#   bash bench/soak/run.sh -duration 1m -out /tmp/soak  # a quick look
#   bash bench/soak/run.sh -h                         # every flag
#
# It installs dnsperf from Debian's packages if it is missing (as root), then
# runs `go run ./bench/soak` with the flags given, which builds cmd/coredns,
# starts the upstream and the server under test, and drives the load.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

if ! command -v dnsperf >/dev/null; then
	if [[ $(id -u) != 0 ]]; then
		echo "run.sh: needs dnsperf (apt-get install -y dnsperf) and is not root" >&2
		exit 1
	fi
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q dnsperf
fi

exec go run ./bench/soak "$@"
