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
	kindFrontend    = "frontend"     // compact with compactcache's front end on the server's address
	kindStock       = "stock"        // cache + forward
	kindKubeCompact = "kube-compact" // the kube-dns Corefile with compactcache
	kindKubeStock   = "kube-stock"   // the kube-dns Corefile with cache
	kindKubeWhoami  = "kube-whoami"  // the kube-dns Corefile with whoami for forward and the cache: its floor
	// kube-frontend: kube-compact with compactcache's front end on the
	// server's address; kube-frontend-noprom, the same without prometheus,
	// for what the per-request series cost a hit; kube-frontend-poller, the
	// same with its readers waiting in Go's poller (wait poller);
	// kube-frontend-coalesce, the same with its readers sleeping
	// coalesceFor between reads once datagrams come that close.
	kindKubeFrontend         = "kube-frontend"
	kindKubeFrontendNoProm   = "kube-frontend-noprom"
	kindKubeFrontendPoller   = "kube-frontend-poller"
	kindKubeFrontendCoalesce = "kube-frontend-coalesce"
	kindUnbound              = "unbound" // Unbound as a caching forwarder: unbound.conf, not a Corefile

	// coalesceFor is kube-frontend-coalesce's: a sleep that gathers two
	// datagrams from 10,000 q/s on.
	coalesceFor = "200us"
)

var kinds = []string{kindWhoami, kindCompact, kindFrontend, kindStock, kindKubeCompact, kindKubeStock, kindKubeWhoami, kindKubeFrontend, kindKubeFrontendNoProm, kindKubeFrontendPoller, kindKubeFrontendCoalesce, kindUnbound}

// ports are the loopback ports of one run.
type ports struct {
	server     int // the server under test, UDP
	upstream   int // the authoritative upstream, UDP and TCP
	upMetrics  int // the upstream's prometheus endpoint
	health     int // kube-dns Corefile: health
	ready      int // kube-dns Corefile: ready
	metrics    int // kube-dns Corefile: prometheus
	pprof      int // the pprof plugin of profile runs
	block      int // frontend: the server block's own listener, behind the front end on server
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
		block:      base + 7,
		reserveEnd: base + 8,
	}
}

// cacheSpec is what a Corefile needs to size the cache under test.
type cacheSpec struct {
	capacity string // compactcache's byte budget, e.g. "256MiB"
	success  int    // the stock cache's success capacity: enough to hold N
}

// upstreamCorefile is the authoritative upstream: CoreDNS's file plugin
// serving the zone of writeData, behind minimal so that positive answers carry
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

// hasFrontend reports whether a kind answers dnsperf from compactcache's
// front end.
func hasFrontend(kind string) bool {
	switch kind {
	case kindFrontend, kindKubeFrontend, kindKubeFrontendNoProm, kindKubeFrontendPoller, kindKubeFrontendCoalesce:
		return true
	}
	return false
}

// corefile returns the Corefile of the server under test. With pprof, the
// pprof plugin listens on p.pprof: it sits outside the plugin chain (it only
// starts an HTTP listener), so the chain, and compactcache's decision to
// write hits as raw bytes, is the same as without it.
//
// For frontend, the front end listens on p.server, where dnsperf sends its
// queries, and the block's own listener, which receives the front end's
// misses in-process and nothing from dnsperf, on p.block.
func corefile(kind string, p ports, cs cacheSpec, pprof bool) (string, error) {
	var b strings.Builder
	listen := p.server
	frontend := hasFrontend(kind)
	if frontend {
		listen = p.block
	}
	fmt.Fprintf(&b, ".:%d {\n    bind 127.0.0.1\n", listen)
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
	case kindFrontend:
		fmt.Fprintf(&b, "    compactcache {\n        capacity %s\n        frontend 127.0.0.1:%d\n    }\n", cs.capacity, p.server)
		fmt.Fprintf(&b, "    forward . %s\n", up)
	case kindStock:
		fmt.Fprintf(&b, "    cache {\n        success %d\n    }\n", cs.success)
		fmt.Fprintf(&b, "    forward . %s\n", up)
	case kindKubeCompact, kindKubeStock, kindKubeWhoami, kindKubeFrontend, kindKubeFrontendNoProm, kindKubeFrontendPoller, kindKubeFrontendCoalesce:
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
`, p.health, p.ready)
		if kind != kindKubeFrontendNoProm {
			fmt.Fprintf(&b, "    prometheus 127.0.0.1:%d\n", p.metrics)
		}
		switch kind {
		case kindKubeWhoami:
			b.WriteString("    whoami\n")
		case kindKubeCompact, kindKubeFrontend, kindKubeFrontendNoProm, kindKubeFrontendPoller, kindKubeFrontendCoalesce:
			fmt.Fprintf(&b, "    forward . %s {\n        max_concurrent 1000\n    }\n", up)
			fmt.Fprintf(&b, "    compactcache 3600 {\n        capacity %s\n", cs.capacity)
			if frontend {
				fmt.Fprintf(&b, "        frontend 127.0.0.1:%d {\n            inflight 1024\n", p.server)
				switch kind {
				case kindKubeFrontendPoller:
					b.WriteString("            wait poller\n")
				case kindKubeFrontendCoalesce:
					b.WriteString("            coalesce " + coalesceFor + "\n")
				}
				b.WriteString("        }\n")
			}
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
	case kindUnbound:
		return "", fmt.Errorf("kind %q is configured by unboundConf, not a Corefile", kind)
	default:
		return "", fmt.Errorf("unknown kind %q; want one of %s", kind, strings.Join(kinds, ", "))
	}
	b.WriteString("}\n")
	return b.String(), nil
}

// unboundCacheSize is Unbound's msg-cache-size and rrset-cache-size: room
// for far more than N = 200,000 entries (an entry takes one message and one
// RRset), so that nothing is evicted. Unbound allocates entries as they
// come, not the whole size at start, so the RSS grows with what it holds.
const unboundCacheSize = "256m"

// unboundConf returns the unbound.conf of the unbound kind: Unbound as a
// caching forwarder on p.server, one thread, forwarding everything to the
// upstream and caching it, without DNSSEC validation (module-config
// "iterator", no trust anchor), as the CoreDNS kinds do. It logs to
// logfile; its pid file and working directory are in dir.
//
// Beside the settings the run needs (listening address, the upstream on the
// loopback, no chroot or privilege drop, no control socket), it turns off
// what the CoreDNS kinds do not do for a hit: prefetch, serving expired
// entries, rotating RRsets, QNAME minimisation (a forwarder sends the full
// name anyway), statistics and query logging.
func unboundConf(p ports, dir, logfile string) string {
	return fmt.Sprintf(`server:
    verbosity: 1
    interface: 127.0.0.1@%[1]d
    port: %[1]d
    do-ip4: yes
    do-ip6: no
    do-udp: yes
    do-tcp: yes
    so-reuseport: no
    num-threads: 1
    access-control: 127.0.0.0/8 allow
    do-not-query-localhost: no
    module-config: "iterator"
    chroot: ""
    username: ""
    directory: "%[2]s"
    pidfile: "%[2]s/unbound.pid"
    use-syslog: no
    logfile: "%[5]s"
    log-queries: no
    log-replies: no
    statistics-interval: 0
    extended-statistics: no
    msg-cache-size: %[3]s
    rrset-cache-size: %[3]s
    cache-min-ttl: 0
    prefetch: no
    prefetch-key: no
    serve-expired: no
    rrset-roundrobin: no
    minimal-responses: yes
    qname-minimisation: no

remote-control:
    control-enable: no

forward-zone:
    name: "."
    forward-addr: 127.0.0.1@%[4]d
    forward-first: no
`, p.server, dir, unboundCacheSize, p.upstream, logfile)
}

// cached reports whether kind has a cache to fill.
func cached(kind string) bool { return kind != kindWhoami && kind != kindKubeWhoami }

// goServer reports whether kind is a CoreDNS server, with the pprof plugin
// (heap MemStats, CPU profiles) and gctrace.
func goServer(kind string) bool { return kind != kindUnbound }

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
	case kindCompact, kindFrontend:
		return kindStock, true
	case kindKubeCompact:
		return kindKubeStock, true
	}
	return "", false
}
