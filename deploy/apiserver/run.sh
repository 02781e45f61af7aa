#!/usr/bin/env bash
# deploy/apiserver/run.sh: the manifests and Corefiles of deploy/kubernetes
# against a real Kubernetes API server on this machine, without a cluster.
#
#   deploy/apiserver/run.sh          build (once), then run TestRealAPIServer
#                                    and TestRealAPIServerWatch
#   deploy/apiserver/run.sh build    only build kube-apiserver and kubectl
#   deploy/apiserver/run.sh bench    build (once), then run BenchmarkClusterDomain
#                                    (needs dnsperf; about 3 minutes)
#
# etcd is Debian's etcd-server (installed with apt-get when missing);
# kube-apiserver and kubectl are built from k8s.io/kubernetes as this
# directory's go.mod pins it, into the user's cache directory under a name
# made of go.mod and go.sum, and reused while they do not change. The test
# (deploy/apiserver_test.go) starts etcd and kube-apiserver on 127.0.0.1
# with certificates made for the run, and stops them when it ends.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

key=$(cat go.mod go.sum | sha256sum | cut -c1-12)
out=${XDG_CACHE_HOME:-$HOME/.cache}/compactcache-apiserver/$key

if [[ ! -x $out/kube-apiserver || ! -x $out/kubectl ]]; then
	echo "building kube-apiserver and kubectl into $out (about 5 minutes cold on 2 cores)" >&2
	mkdir -p "$out"
	# A module outside the workspace of the repository's go.work; the
	# version as Kubernetes's own build stamps it, for --version and kubectl.
	v=$(GOWORK=off go list -m -f '{{.Version}}' k8s.io/kubernetes)
	minor=${v#v*.}
	pkg=k8s.io/component-base/version
	GOWORK=off nice -n 10 go build -trimpath -o "$out/" \
		-ldflags "-X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor%%.*} -X $pkg.gitTreeState=clean" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
fi
"$out/kube-apiserver" --version
[[ ${1:-} == build ]] && exit 0

if ! command -v etcd >/dev/null; then
	echo "installing etcd-server" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
fi
# sed reads all of it: head would end etcd with SIGPIPE, which pipefail
# counts as a failure.
etcd --version | sed -n 1p

cd "$here/.."
if [[ ${1:-} == bench ]]; then
	exec go test -v -run '^$' -bench '^BenchmarkClusterDomain$' -benchtime 1x -timeout 20m .
fi
exec go test -count=1 -v -run '^TestRealAPIServer' -timeout 15m .
