package kube

import (
	"slices"
	"strings"
	"testing"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/coredns/coredns/plugin/kubernetes/object"
	"github.com/miekg/dns"
	api "k8s.io/api/core/v1"
)

// svc is a ClusterIP Service as object.ToService makes it.
func svc(ns, name string, ips []string, ports ...api.ServicePort) *object.Service {
	if len(ports) == 0 {
		ports = []api.ServicePort{{Port: -1}} // ToService's sentinel
	}
	return &object.Service{Name: name, Namespace: ns, Index: object.ServiceKey(name, ns), ClusterIPs: ips,
		Type: api.ServiceTypeClusterIP, Ports: ports, Version: "1"}
}

func headless(ns, name string, ports ...api.ServicePort) *object.Service {
	return svc(ns, name, []string{api.ClusterIPNone}, ports...)
}

func external(ns, name, target string) *object.Service {
	s := svc(ns, name, []string{""})
	s.Type, s.ExternalName = api.ServiceTypeExternalName, target
	return s
}

func port(name string, n int32) api.ServicePort {
	return api.ServicePort{Name: name, Port: n, Protocol: api.ProtocolTCP}
}

// slice is an EndpointSlice as object.EndpointSliceToEndpoints makes it;
// addrs are IP or IP=HOSTNAME or IP=HOSTNAME=POD.
func slice(ns, name, service string, ports []object.EndpointPort, addrs ...string) *object.Endpoints {
	e := &object.Endpoints{Name: name, Namespace: ns, Index: object.EndpointsKey(service, ns), Version: "1",
		Subsets: []object.EndpointSubset{{Ports: ports}}}
	for _, a := range addrs {
		f := strings.Split(a, "=")
		ea := object.EndpointAddress{IP: f[0]}
		if len(f) > 1 {
			ea.Hostname = f[1]
		}
		if len(f) > 2 {
			ea.TargetRefName = f[2]
		}
		e.Subsets[0].Addresses = append(e.Subsets[0].Addresses, ea)
		e.IndexIP = append(e.IndexIP, f[0])
	}
	return e
}

func eport(name string, n int32) []object.EndpointPort {
	return []object.EndpointPort{{Name: name, Port: n, Protocol: "TCP"}}
}

// names reads a batch's names and subtrees, in presentation form, sorted;
// subtrees are marked with a leading "*.".
func names(b *batch) []string {
	var out []string
	for _, f := range b.take() {
		for _, n := range f.Names {
			s, _, err := dns.UnpackDomainName(n, 0)
			if err != nil {
				panic(err)
			}
			if f.Scope == flush.Zones {
				s = "*." + s
			}
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

var clusterZones = []string{"cluster.local.", "in-addr.arpa.", "ip6.arpa."}

const z = ".svc.cluster.local."

// step is one change told to a view.
type step struct {
	svc *object.Service   // a Service's new state
	ep  *object.Endpoints // an EndpointSlice's new state
	// gone, with svc or ep: the object is deleted.
	gone bool
}

func (s step) apply(v *clusterView, b *batch) {
	switch {
	case s.svc != nil && s.gone:
		v.Service(b, s.svc.Index, nil)
	case s.svc != nil:
		v.Service(b, s.svc.Index, s.svc)
	case s.gone:
		v.Endpoints(b, keyOf(s.ep), nil)
	default:
		v.Endpoints(b, keyOf(s.ep), s.ep)
	}
}

func TestViewNames(t *testing.T) {
	web := svc("ns", "web", []string{"10.96.0.10", "fd00::10"}, port("http", 80))
	db := headless("ns", "db", port("pg", 5432))
	dbSlice := slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0", "10.1.0.2")
	kdns := svc("kube-system", "kube-dns", []string{"10.96.0.10"}, port("dns", 53))
	dnsSlice := slice("kube-system", "kube-dns-1", "kube-dns", eport("dns", 53), "10.1.0.1", "10.1.0.2")
	for _, tc := range []struct {
		name   string
		namer  func(*namer)
		view   func(*clusterView)
		keep   []string // the cache's zones; all when empty
		before []step   // the view's state, flushing nothing
		change []step
		want   []string
		kinds  [numKinds]int64
	}{
		{
			name:   "a Service, the first of its namespace",
			change: []step{{svc: web}},
			want: []string{
				"0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", "10.0.96.10.in-addr.arpa.",
				"_http._tcp.web.ns" + z, "ns.pod.cluster.local.", "ns.svc.cluster.local.", "web.ns" + z,
			},
			kinds: [numKinds]int64{kindService: 1, kindNamespace: 1},
		},
		{
			name:   "a second Service in the namespace: not the namespace's names",
			before: []step{{svc: web}},
			change: []step{{svc: svc("ns", "api", []string{"10.96.0.11"}, port("grpc", 9000))}},
			want:   []string{"11.0.96.10.in-addr.arpa.", "_grpc._tcp.api.ns" + z, "api.ns" + z},
			kinds:  [numKinds]int64{kindService: 1},
		},
		{
			name:   "the same Service again, a new version only: nothing",
			before: []step{{svc: web}},
			change: []step{{svc: func() *object.Service { s := *web; s.Version = "2"; return &s }()}},
			kinds:  [numKinds]int64{},
		},
		{
			name:   "deleted and created with another ClusterIP: the old and new PTR names",
			before: []step{{svc: web}, {svc: svc("ns", "api", []string{"10.96.0.11"})}},
			change: []step{{svc: web, gone: true}, {svc: svc("ns", "web", []string{"10.96.0.20"}, port("http", 80))}},
			want: []string{
				"0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", "10.0.96.10.in-addr.arpa.",
				"20.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "web.ns" + z,
			},
			kinds: [numKinds]int64{kindService: 2},
		},
		{
			name:   "a port renamed: the old and new port names",
			before: []step{{svc: web}},
			change: []step{{svc: svc("ns", "web", []string{"10.96.0.10", "fd00::10"}, port("https", 443))}},
			want: []string{
				"0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", "10.0.96.10.in-addr.arpa.",
				"_http._tcp.web.ns" + z, "_https._tcp.web.ns" + z, "web.ns" + z,
			},
			kinds: [numKinds]int64{kindService: 1},
		},
		{
			name:   "an ExternalName Service: its name, no address",
			before: []step{{svc: web}},
			change: []step{{svc: external("ns", "ext", "www.example.org")}},
			want:   []string{"ext.ns" + z},
			kinds:  [numKinds]int64{kindService: 1},
		},
		{
			name:   "an ExternalName's target changed",
			before: []step{{svc: web}, {svc: external("ns", "ext", "www.example.org")}},
			change: []step{{svc: external("ns", "ext", "www.example.net")}},
			want:   []string{"ext.ns" + z},
			kinds:  [numKinds]int64{kindService: 1},
		},
		{
			name:   "a headless Service's endpoint moved: its name, port name, the endpoint's names and PTR names; not the unchanged one's",
			before: []step{{svc: db}, {ep: dbSlice}},
			change: []step{{ep: slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0", "10.1.0.3")}},
			want: []string{
				"10-1-0-2.db.ns" + z, "10-1-0-3.db.ns" + z, "2.0.1.10.in-addr.arpa.", "3.0.1.10.in-addr.arpa.",
				"_pg._tcp.db.ns" + z, "db.ns" + z,
			},
			kinds: [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "a headless Service's endpoint given a hostname: the names of both, and its PTR name",
			before: []step{{svc: db}, {ep: dbSlice}},
			change: []step{{ep: slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0", "10.1.0.2=db-1")}},
			want: []string{
				"10-1-0-2.db.ns" + z, "2.0.1.10.in-addr.arpa.", "_pg._tcp.db.ns" + z, "db-1.db.ns" + z, "db.ns" + z,
			},
			kinds: [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "a ClusterIP Service's endpoint moved: the endpoints' names, not the Service's",
			before: []step{{svc: web}, {ep: slice("ns", "web-1", "web", eport("http", 8080), "10.1.1.1")}},
			change: []step{{ep: slice("ns", "web-1", "web", eport("http", 8080), "10.1.1.2")}},
			want:   []string{"1.1.1.10.in-addr.arpa.", "10-1-1-1.web.ns" + z, "10-1-1-2.web.ns" + z, "2.1.1.10.in-addr.arpa."},
			kinds:  [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "a slice's ports changed: every endpoint's name",
			before: []step{{svc: db}, {ep: dbSlice}},
			change: []step{{ep: slice("ns", "db-1", "db", eport("pg", 5433), "10.1.0.1=db-0", "10.1.0.2")}},
			want:   []string{"10-1-0-2.db.ns" + z, "_pg._tcp.db.ns" + z, "db-0.db.ns" + z, "db.ns" + z},
			kinds:  [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "an IPv6 endpoint: dashed, a final 0 after a trailing dash, its ip6.arpa PTR name",
			before: []step{{svc: db}},
			change: []step{{ep: slice("ns", "db-6", "db", eport("pg", 5432), "fd00:1::")}},
			want: []string{
				"0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0.0.0.0.d.f.ip6.arpa.",
				"_pg._tcp.db.ns" + z, "db.ns" + z, "fd00-1--0.db.ns" + z,
			},
			kinds: [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "endpoint_pod_names: an endpoint without a hostname named after its pod",
			namer:  func(n *namer) { n.PodNames = true },
			before: []step{{svc: db}},
			change: []step{{ep: slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.5==db-7f9c")}},
			want:   []string{"5.0.1.10.in-addr.arpa.", "_pg._tcp.db.ns" + z, "db-7f9c.db.ns" + z, "db.ns" + z},
			kinds:  [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "a slice whose Service does not exist: only the PTR names, which endpoints answer alone",
			change: []step{{ep: slice("ns", "lone-1", "lone", eport("x", 1), "10.1.2.1")}},
			want:   []string{"1.2.1.10.in-addr.arpa."},
			kinds:  [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "a headless Service created after its slice: its endpoints' names come with it",
			before: []step{{svc: web}, {ep: dbSlice}},
			change: []step{{svc: db}},
			want:   []string{"10-1-0-2.db.ns" + z, "_pg._tcp.db.ns" + z, "db-0.db.ns" + z, "db.ns" + z},
			kinds:  [numKinds]int64{kindService: 1},
		},
		{
			// A selector-less headless Service whose slices name ports the
			// Service does not: the port names answer from the slices.
			name:   "a headless Service without ports created after its slice: the slice's port names",
			before: []step{{svc: web}, {ep: dbSlice}},
			change: []step{{svc: headless("ns", "db")}},
			want:   []string{"10-1-0-2.db.ns" + z, "_pg._tcp.db.ns" + z, "db-0.db.ns" + z, "db.ns" + z},
			kinds:  [numKinds]int64{kindService: 1},
		},
		{
			name:   "a headless Service without ports deleted: the slice's port names",
			before: []step{{svc: web}, {svc: headless("ns", "db")}, {ep: dbSlice}},
			change: []step{{svc: headless("ns", "db"), gone: true}},
			want:   []string{"10-1-0-2.db.ns" + z, "_pg._tcp.db.ns" + z, "db-0.db.ns" + z, "db.ns" + z},
			kinds:  [numKinds]int64{kindService: 1},
		},
		{
			name:   "the last Service of a namespace deleted: its endpoints' names, and the namespace's",
			before: []step{{svc: db}, {ep: dbSlice}},
			change: []step{{svc: db, gone: true}},
			want: []string{
				"10-1-0-2.db.ns" + z, "_pg._tcp.db.ns" + z, "db-0.db.ns" + z, "db.ns" + z,
				"ns.pod.cluster.local.", "ns.svc.cluster.local.",
			},
			kinds: [numKinds]int64{kindService: 1, kindNamespace: 1},
		},
		{
			name:   "a slice deleted: its endpoints' names and PTR names, the headless Service's names",
			before: []step{{svc: db}, {ep: dbSlice}},
			change: []step{{ep: dbSlice, gone: true}},
			want: []string{
				"1.0.1.10.in-addr.arpa.", "10-1-0-2.db.ns" + z, "2.0.1.10.in-addr.arpa.", "_pg._tcp.db.ns" + z,
				"db-0.db.ns" + z, "db.ns" + z,
			},
			kinds: [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "a slice's addresses reordered, nothing else: the Service's names only",
			before: []step{{svc: db}, {ep: dbSlice}},
			change: []step{{ep: slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.2", "10.1.0.1=db-0")}},
			kinds:  [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "a namespace the plugin does not expose: nothing",
			view:   func(v *clusterView) { v.namespaces = map[string]struct{}{"other": {}} },
			change: []step{{svc: web}, {ep: dbSlice}},
		},
		{
			name:   "a cache of cluster.local alone: no PTR names",
			keep:   []string{"cluster.local."},
			change: []step{{svc: svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))}},
			want:   []string{"_http._tcp.web.ns" + z, "ns.pod.cluster.local.", "ns.svc.cluster.local.", "web.ns" + z},
			kinds:  [numKinds]int64{kindService: 1, kindNamespace: 1},
		},
		{
			name:   "a cache of in-addr.arpa alone: the PTR name",
			keep:   []string{"in-addr.arpa."},
			change: []step{{svc: svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))}},
			want:   []string{"10.0.96.10.in-addr.arpa."},
			kinds:  [numKinds]int64{kindService: 1, kindNamespace: 1},
		},
		{
			name:   "PTR names outside the plugin's zones: not made",
			namer:  func(n *namer) { *n = newNamer([]string{"cluster.local."}) },
			change: []step{{svc: svc("ns", "web", []string{"10.96.0.10"})}},
			want:   []string{"ns.pod.cluster.local.", "ns.svc.cluster.local.", "web.ns" + z},
			kinds:  [numKinds]int64{kindService: 1, kindNamespace: 1},
		},
		{
			name:   "two cluster domains: the names in each",
			namer:  func(n *namer) { *n = newNamer([]string{"cluster.local.", "example.internal."}) },
			before: []step{{svc: web}},
			change: []step{{svc: external("ns", "ext", "www.example.org")}},
			want:   []string{"ext.ns" + z, "ext.ns.svc.example.internal."},
			kinds:  [numKinds]int64{kindService: 1},
		},
		{
			name:   "ignore empty_service: a ClusterIP Service's names when its first endpoint comes",
			view:   func(v *clusterView) { v.ignoreEmpty = true },
			before: []step{{svc: svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))}},
			change: []step{{ep: slice("ns", "web-1", "web", eport("http", 8080), "10.1.1.1")}},
			want: []string{
				"1.1.1.10.in-addr.arpa.", "10-1-1-1.web.ns" + z, "10.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "web.ns" + z,
			},
			kinds: [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "ClusterIP to ExternalName: the endpoints' names, whose slices stay",
			before: []step{{svc: svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))}, {ep: slice("ns", "web-1", "web", eport("http", 8080), "10.1.1.1", "10.1.1.2=web-0")}},
			change: []step{{svc: external("ns", "web", "www.example.org")}},
			want: []string{
				"10-1-1-1.web.ns" + z, "10.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "web-0.web.ns" + z, "web.ns" + z,
			},
			kinds: [numKinds]int64{kindService: 1},
		},
		{
			name:   "ExternalName to ClusterIP: the endpoints' names",
			before: []step{{svc: external("ns", "web", "www.example.org")}, {ep: slice("ns", "web-1", "web", eport("http", 8080), "10.1.1.1", "10.1.1.2=web-0")}},
			change: []step{{svc: svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))}},
			want: []string{
				"10-1-1-1.web.ns" + z, "10.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "web-0.web.ns" + z, "web.ns" + z,
			},
			kinds: [numKinds]int64{kindService: 1},
		},
		{
			name: "ExternalName aliases of a cluster name, along a chain, with their target",
			before: []step{{svc: db}, {ep: dbSlice},
				{svc: external("other", "alias", "DB.ns.svc.cluster.local")}, {svc: external("other", "alias2", "alias.other.svc.cluster.local.")},
				{svc: external("other", "outside", "www.example.org")}},
			change: []step{{ep: slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0", "10.1.0.3")}},
			want: []string{
				"10-1-0-2.db.ns" + z, "10-1-0-3.db.ns" + z, "2.0.1.10.in-addr.arpa.", "3.0.1.10.in-addr.arpa.",
				"_pg._tcp.db.ns" + z, "alias.other" + z, "alias2.other" + z, "db.ns" + z,
			},
			kinds: [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "the nameserver's slice changed: the apexes and ns.dns names, whose answers list its Services",
			view:   func(v *clusterView) { v.setServers(map[string]struct{}{"10.1.0.1": {}}) },
			before: []step{{svc: kdns}, {ep: dnsSlice}},
			change: []step{{ep: slice("kube-system", "kube-dns-1", "kube-dns", eport("dns", 53), "10.1.0.1", "10.1.0.3")}},
			want: []string{
				"10-1-0-2.kube-dns.kube-system" + z, "10-1-0-3.kube-dns.kube-system" + z, "2.0.1.10.in-addr.arpa.", "3.0.1.10.in-addr.arpa.",
				"cluster.local.", "in-addr.arpa.", "ip6.arpa.", "ns.dns.cluster.local.", "ns.dns.in-addr.arpa.", "ns.dns.ip6.arpa.",
			},
			kinds: [numKinds]int64{kindEndpoints: 1},
		},
		{
			// nsAddrs finds them whatever the plugin's namespaces option
			// exposes.
			name: "the nameserver's slice changed in a namespace the plugin does not expose: the same names",
			view: func(v *clusterView) {
				v.namespaces = map[string]struct{}{"default": {}}
				v.setServers(map[string]struct{}{"10.1.0.1": {}})
			},
			before: []step{{ep: dnsSlice}, {svc: kdns}},
			change: []step{{ep: slice("kube-system", "kube-dns-1", "kube-dns", eport("dns", 53), "10.1.0.1", "10.1.0.3")}},
			want: []string{
				"10-1-0-2.kube-dns.kube-system" + z, "10-1-0-3.kube-dns.kube-system" + z, "2.0.1.10.in-addr.arpa.", "3.0.1.10.in-addr.arpa.",
				"cluster.local.", "in-addr.arpa.", "ip6.arpa.", "ns.dns.cluster.local.", "ns.dns.in-addr.arpa.", "ns.dns.ip6.arpa.",
			},
			kinds: [numKinds]int64{kindEndpoints: 1},
		},
		{
			name: "a namespace the plugin does not expose, Services and slices not the nameserver's: nothing",
			view: func(v *clusterView) {
				v.namespaces = map[string]struct{}{"default": {}}
				v.setServers(map[string]struct{}{"10.1.0.1": {}})
			},
			before: []step{{ep: dnsSlice}, {svc: kdns}},
			change: []step{{svc: web}, {ep: slice("ns", "web-1", "web", eport("http", 8080), "10.1.1.1")},
				{svc: svc("kube-system", "metrics", []string{"10.96.0.20"})}, {ep: slice("kube-system", "metrics-1", "metrics", nil, "10.1.1.2")}},
		},
		{
			name:   "the nameserver's Service at another ClusterIP: the apexes and ns.dns names",
			view:   func(v *clusterView) { v.setServers(map[string]struct{}{"10.1.0.1": {}}) },
			before: []step{{svc: kdns}, {ep: dnsSlice}},
			change: []step{{svc: svc("kube-system", "kube-dns", []string{"10.96.0.11"}, port("dns", 53))}},
			want: []string{
				"10.0.96.10.in-addr.arpa.", "11.0.96.10.in-addr.arpa.", "_dns._tcp.kube-dns.kube-system" + z,
				"cluster.local.", "in-addr.arpa.", "ip6.arpa.", "kube-dns.kube-system" + z,
				"ns.dns.cluster.local.", "ns.dns.in-addr.arpa.", "ns.dns.ip6.arpa.",
			},
			kinds: [numKinds]int64{kindService: 1},
		},
		{
			name:   "a slice not the nameserver's: no apex",
			view:   func(v *clusterView) { v.setServers(map[string]struct{}{"10.1.0.9": {}}) },
			before: []step{{svc: kdns}, {ep: dnsSlice}},
			change: []step{{ep: slice("kube-system", "kube-dns-1", "kube-dns", eport("dns", 53), "10.1.0.1")}},
			want:   []string{"10-1-0-2.kube-dns.kube-system" + z, "2.0.1.10.in-addr.arpa."},
			kinds:  [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "the nameserver's addresses unknown (a watch of its own): any slice may be its",
			view:   func(v *clusterView) { v.setServers(nil) },
			keep:   []string{"cluster.local."},
			before: []step{{svc: kdns}, {ep: dnsSlice}},
			change: []step{{ep: slice("kube-system", "kube-dns-1", "kube-dns", eport("dns", 53), "10.1.0.1")}},
			want:   []string{"10-1-0-2.kube-dns.kube-system" + z, "cluster.local.", "ns.dns.cluster.local."},
			kinds:  [numKinds]int64{kindEndpoints: 1},
		},
		{
			name: "an alias in the cache's zones of a target outside them, through an alias outside them too",
			keep: []string{"other.svc.cluster.local."},
			before: []step{{svc: db}, {ep: dbSlice},
				{svc: external("mid", "alias", "db.ns.svc.cluster.local")}, {svc: external("other", "alias", "alias.mid.svc.cluster.local")}},
			change: []step{{ep: slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0", "10.1.0.3")}},
			want:   []string{"alias.other" + z},
			kinds:  [numKinds]int64{kindEndpoints: 1},
		},
		{
			name:   "zonal: a headless Service's zones changed: the subtree of its zone-scoped names",
			namer:  func(n *namer) { n.Zonal = true },
			before: []step{{svc: db}, {ep: dbSlice}},
			change: []step{{ep: func() *object.Endpoints {
				e := slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0", "10.1.0.2")
				e.Zones = map[string]string{"10.1.0.1": "zone-a"}
				return e
			}()}},
			want:  []string{"*._zone.db.ns" + z, "_pg._tcp.db.ns" + z, "db.ns" + z},
			kinds: [numKinds]int64{kindEndpoints: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNamer(clusterZones)
			if tc.namer != nil {
				tc.namer(&n)
			}
			v := newClusterView(n)
			if tc.view != nil {
				tc.view(v)
			}
			for _, s := range tc.before {
				s.apply(v, nil)
			}
			b := newBatch(dnsmsg.NewZoneSet(tc.keep))
			for _, s := range tc.change {
				s.apply(v, b)
			}
			if got := names(b); !slices.Equal(got, tc.want) {
				t.Errorf("names\n got %q\nwant %q", got, tc.want)
			}
			if b.changes != tc.kinds {
				t.Errorf("changes by kind %v, want %v", b.changes, tc.kinds)
			}
		})
	}
}

// TestWatchViewIgnoresEmpty: a watch of its own does not know whether the
// cluster DNS has `ignore empty_service`, under which a ClusterIP Service
// without endpoints answers NXDOMAIN: it flushes the Service's name when
// the first endpoint comes, as follow mode does with an option it cannot
// read.
func TestWatchViewIgnoresEmpty(t *testing.T) {
	v := watchView(newNamer(clusterZones))
	web := svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))
	v.Service(nil, web.Index, web)
	b := newBatch(dnsmsg.NewZoneSet(nil))
	v.Endpoints(b, epKey{"ns", "web-1"}, slice("ns", "web-1", "web", eport("http", 8080), "10.1.1.1"))
	if got := names(b); !slices.Contains(got, "web.ns"+z) {
		t.Errorf("the first endpoint of a ClusterIP Service flushed %q: not web.ns%s", got, z)
	}
}

// TestViewZonal: under zonal, a headless Service's zone-scoped names
// answer its endpoints, and their subtree is dropped when the endpoints
// change; a ClusterIP Service's are NXDOMAIN whatever changes, so no walk
// of the store for them. A watch of its own, which cannot read the option,
// drops neither: a walk for every change of a headless Service's endpoints
// is too dear for names only zonal answers.
func TestViewZonal(t *testing.T) {
	zonal := newNamer(clusterZones)
	zonal.Zonal = true
	for _, tc := range []struct {
		name string
		view *clusterView
		want bool
	}{
		{"zonal", newClusterView(zonal), true},
		{"a watch of its own", watchView(newNamer(clusterZones)), false},
	} {
		v := tc.view
		db := headless("ns", "db", port("pg", 5432))
		web := svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))
		for _, s := range []*object.Service{db, web} {
			v.Service(nil, s.Index, s)
		}
		v.Endpoints(nil, epKey{"ns", "db-1"}, slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1"))
		b := newBatch(nil)
		v.Endpoints(b, epKey{"ns", "db-1"}, slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.2"))
		v.Service(b, web.Index, svc("ns", "web", []string{"10.96.0.10"}, port("http", 8080)))
		got := names(b)
		if slices.Contains(got, "*._zone.db.ns"+z) != tc.want || slices.Contains(got, "*._zone.web.ns"+z) {
			t.Errorf("%s: flushed %q: want db's zone-scoped subtree %v, web's never", tc.name, got, tc.want)
		}
	}
}

// TestViewRecreate: a Service deleted and created again, told in one
// diff or in two, leaves the view as it found it, and the namespace's
// count with it.
func TestViewRecreate(t *testing.T) {
	v := newClusterView(newNamer(clusterZones))
	web := svc("ns", "web", []string{"10.96.0.10"})
	v.Service(nil, web.Index, web)
	for range 3 {
		b := newBatch(nil)
		v.Service(b, web.Index, nil)
		v.Service(b, web.Index, svc("ns", "web", []string{"10.96.0.10"}))
		if got := names(b); !slices.Contains(got, "web.ns"+z) {
			t.Errorf("names %q: not the Service's", got)
		}
	}
	if v.perNS["ns"] != 1 || len(v.svcs) != 1 {
		t.Errorf("after recreations: %d Services in ns, %d in the clusterView; want 1 and 1", v.perNS["ns"], len(v.svcs))
	}
	b := newBatch(nil)
	v.Service(b, web.Index, nil)
	if len(v.perNS) != 0 || !slices.Contains(names(b), "ns.svc.cluster.local.") {
		t.Errorf("the last Service gone: namespaces %v, want none and the namespace's names flushed", v.perNS)
	}
}

func TestNamerRoot(t *testing.T) {
	// A plugin serving the root zone: the names stand under it.
	b := newBatch(nil)
	n := newNamer([]string{"."})
	n.service(b, svc("ns", "web", []string{"10.96.0.10"}, port("http", 80)))
	want := []string{"10.0.96.10.in-addr.arpa.", "_http._tcp.web.ns.svc.", "web.ns.svc."}
	if got := names(b); !slices.Equal(got, want) {
		t.Errorf("names %q, want %q", got, want)
	}
}

// TestViewRebase: a view filled with no batch, rebased on a stopped
// source's view, names what changed between them and nothing else, and
// sweeps as a view of its own afterwards.
func TestViewRebase(t *testing.T) {
	fill := func(v *clusterView, steps []step) *clusterView {
		for _, s := range steps {
			s.apply(v, nil)
		}
		return v
	}
	cluster := func() []step {
		return []step{
			{svc: svc("ns", "web", []string{"10.96.0.10"}, port("http", 80))},
			{svc: external("ns", "alias", "web.ns.svc.cluster.local")},
			{svc: headless("ns", "db", port("pg", 5432))},
			{ep: slice("ns", "db-1", "db", eport("pg", 5432), "10.1.0.1=db-0")},
		}
	}
	for _, tc := range []struct {
		name string
		now  func([]step) []step
		want []string
	}{
		{
			name: "nothing changed, every object a new one",
			now:  func(s []step) []step { return s },
		},
		{
			name: "a Service recreated at another ClusterIP, an alias of it",
			now: func(s []step) []step {
				s[0].svc = svc("ns", "web", []string{"10.96.0.20"}, port("http", 80))
				return s
			},
			want: []string{"10.0.96.10.in-addr.arpa.", "20.0.96.10.in-addr.arpa.", "_http._tcp.web.ns" + z, "alias.ns" + z, "web.ns" + z},
		},
		{
			name: "an EndpointSlice deleted",
			now:  func(s []step) []step { return s[:3] },
			want: []string{"1.0.1.10.in-addr.arpa.", "_pg._tcp.db.ns" + z, "db-0.db.ns" + z, "db.ns" + z},
		},
		{
			name: "the last Service of a namespace deleted, one in another created",
			now: func([]step) []step {
				return []step{{svc: svc("other", "api", []string{"10.96.0.30"})}}
			},
			want: []string{
				"1.0.1.10.in-addr.arpa.", "10.0.96.10.in-addr.arpa.", "30.0.96.10.in-addr.arpa.",
				"_http._tcp.web.ns" + z, "_pg._tcp.db.ns" + z, "alias.ns" + z, "api.other" + z, "db-0.db.ns" + z, "db.ns" + z,
				"ns.pod.cluster.local.", "ns.svc.cluster.local.", "other.pod.cluster.local.", "other.svc.cluster.local.", "web.ns" + z,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := fill(newClusterView(newNamer(clusterZones)), cluster())
			// Its sweeps' marks: the mark of the new view's next sweep.
			for _, e := range base.svcs {
				e.gen = 1
			}
			for _, e := range base.eps {
				e.gen = 1
			}
			now := tc.now(cluster())
			v := fill(newClusterView(newNamer(clusterZones)), now)
			b := newBatch(nil)
			v.rebase(b, base)
			if got := names(b); !slices.Equal(got, tc.want) {
				t.Errorf("names %q, want %q", got, tc.want)
			}
			if len(v.svcs) != len(fill(newClusterView(newNamer(clusterZones)), now).svcs) {
				t.Errorf("%d Services in the view, want those of now", len(v.svcs))
			}
			// A follow's sweep: every Service gone from the controller.
			f := &follow{ctl: &fakeCtl{synced: true}, view: v}
			b = newBatch(nil)
			f.diff(b)
			if len(v.svcs) != 0 || len(v.eps) != 0 || len(v.perNS) != 0 {
				t.Errorf("after a sweep of an empty cluster: %d Services, %d slices, %d namespaces left", len(v.svcs), len(v.eps), len(v.perNS))
			}
		})
	}
}
