//go:build linux

package main

import (
	"fmt"
	"strings"
)

// Kinds of server under test. Each is written as a Corefile by corefile.
const (
	kindWhoami      = "whoami"       // whoami alone: the server core's floor
	kindCompact     = "compact"      // compactcache + forward
	kindStock       = "stock"        // cache + forward
	kindKubeCompact = "kube-compact" // the kube-dns Corefile with compactcache
	kindKubeStock   = "kube-stock"   // the kube-dns Corefile with cache
	kindKubeWhoami  = "kube-whoami"  // the kube-dns Corefile with whoami for forward and the cache: its floor
)

var kinds = []string{kindWhoami, kindCompact, kindStock, kindKubeCompact, kindKubeStock, kindKubeWhoami}

// ports are the loopback ports of one run.
type ports struct {
	server     int // the server under test, UDP
	upstream   int // the authoritative upstream, UDP and TCP
	upMetrics  int // the upstream's prometheus endpoint
	health     int // kube-dns Corefile: health
	ready      int // kube-dns Corefile: ready
	metrics    int // kube-dns Corefile: prometheus
	pprof      int // the pprof plugin of profile runs
	reserveEnd int // one past the last port used
}

func newPorts(base int) ports {
	return ports{
		server:     base,
		upstream:   base + 1,
		upMetrics:  base + 2,
		health:     base + 3,
		ready:      base + 4,
		metrics:    base + 5,
		pprof:      base + 6,
		reserveEnd: base + 7,
	}
}

// cacheSpec is what a Corefile needs to size the cache under test.
type cacheSpec struct {
	capacity string // compactcache's byte budget, e.g. "256MiB"
	success  int    // the stock cache's success capacity: enough to hold N
}

// upstreamCorefile is the authoritative upstream: CoreDNS's file plugin
// serving the zone of zonegen, behind minimal so that positive answers carry
// the answer section alone, as workload.Reply does (file would add the apex
// NS records to the authority section of every answer).
func upstreamCorefile(p ports, zone string) string {
	return fmt.Sprintf(`.:%d {
    bind 127.0.0.1
    prometheus 127.0.0.1:%d
    minimal
    file %s .
}
`, p.upstream, p.upMetrics, zone)
}

// corefile returns the Corefile of the server under test. With pprof, the
// pprof plugin listens on p.pprof: it sits outside the plugin chain (it only
// starts an HTTP listener), so the chain, and compactcache's decision to
// write hits as raw bytes, is the same as without it.
func corefile(kind string, p ports, cs cacheSpec, pprof bool) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, ".:%d {\n    bind 127.0.0.1\n", p.server)
	if pprof {
		fmt.Fprintf(&b, "    pprof 127.0.0.1:%d\n", p.pprof)
	}
	up := fmt.Sprintf("127.0.0.1:%d", p.upstream)
	switch kind {
	case kindWhoami:
		b.WriteString("    whoami\n")
	case kindCompact:
		fmt.Fprintf(&b, "    compactcache {\n        capacity %s\n    }\n", cs.capacity)
		fmt.Fprintf(&b, "    forward . %s\n", up)
	case kindStock:
		fmt.Fprintf(&b, "    cache {\n        success %d\n    }\n", cs.success)
		fmt.Fprintf(&b, "    forward . %s\n", up)
	case kindKubeCompact, kindKubeStock, kindKubeWhoami:
		// The Corefile kubeadm and the CoreDNS Helm chart install, with:
		//   - no kubernetes block: it needs an API server;
		//   - every listener on the loopback;
		//   - forward to the local upstream instead of /etc/resolv.conf;
		//   - the cache's TTL cap at 3600 instead of 30, so that the filled
		//     entries (TTL 3600) stay fresh for the whole run;
		//   - for kube-whoami, whoami in place of forward and the cache:
		//     what the block's other plugins cost.
		fmt.Fprintf(&b, `    errors
    health 127.0.0.1:%d {
        lameduck 5s
    }
    ready 127.0.0.1:%d
    # kubernetes cluster.local in-addr.arpa ip6.arpa { ... } left out: no API server here
    prometheus 127.0.0.1:%d
`, p.health, p.ready, p.metrics)
		switch kind {
		case kindKubeWhoami:
			b.WriteString("    whoami\n")
		case kindKubeCompact:
			fmt.Fprintf(&b, "    forward . %s {\n        max_concurrent 1000\n    }\n", up)
			fmt.Fprintf(&b, "    compactcache 3600 {\n        capacity %s\n", cs.capacity)
		default:
			fmt.Fprintf(&b, "    forward . %s {\n        max_concurrent 1000\n    }\n", up)
			fmt.Fprintf(&b, "    cache 3600 {\n        success %d\n", cs.success)
		}
		if kind != kindKubeWhoami {
			b.WriteString(`        disable success cluster.local
        disable denial cluster.local
    }
`)
		}
		b.WriteString(`    loop
    reload
    loadbalance
`)
	default:
		return "", fmt.Errorf("unknown kind %q; want one of %s", kind, strings.Join(kinds, ", "))
	}
	b.WriteString("}\n")
	return b.String(), nil
}

// cached reports whether kind has a cache to fill.
func cached(kind string) bool { return kind != kindWhoami && kind != kindKubeWhoami }

// floorOf returns the whoami kind that measures kind's floor.
func floorOf(kind string) string {
	if strings.HasPrefix(kind, "kube-") {
		return kindKubeWhoami
	}
	return kindWhoami
}

// stockOf returns the kind with the stock cache in compactcache's place.
func stockOf(kind string) (string, bool) {
	switch kind {
	case kindCompact:
		return kindStock, true
	case kindKubeCompact:
		return kindKubeStock, true
	}
	return "", false
}
