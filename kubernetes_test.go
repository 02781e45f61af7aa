package compactcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/kube"
	"github.com/compactcache/compactcache/internal/lifecycle"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/kubernetes"
	"github.com/coredns/coredns/plugin/kubernetes/object"
	"github.com/miekg/dns"
	api "k8s.io/api/core/v1"
)

// fakeAPI is the kubernetes plugin's controller as its informers keep it,
// in memory: a change replaces the object and sets Modified to its second.
type fakeAPI struct {
	mu   sync.Mutex
	mod  int64
	svcs []*object.Service
	eps  []*object.Endpoints
	asks int // SvcIndex calls: the plugin answering a service name
}

func (f *fakeAPI) setService(s *object.Service, gone bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.svcs = slices.DeleteFunc(f.svcs, func(x *object.Service) bool { return x.Index == s.Index })
	if !gone {
		f.svcs = append(f.svcs, s)
	}
	f.mod = time.Now().Unix()
}

func (f *fakeAPI) setEndpoints(e *object.Endpoints) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.eps = slices.DeleteFunc(f.eps, func(x *object.Endpoints) bool { return x.Name == e.Name && x.Namespace == e.Namespace })
	f.eps = append(f.eps, e)
	f.mod = time.Now().Unix()
}

func (f *fakeAPI) ServiceList() []*object.Service {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.svcs)
}

func (f *fakeAPI) EndpointsList() []*object.Endpoints {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.eps)
}

func (f *fakeAPI) SvcIndex(idx string) []*object.Service {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asks++
	var out []*object.Service
	for _, s := range f.svcs {
		if s.Index == idx {
			out = append(out, s)
		}
	}
	return out
}

func (f *fakeAPI) SvcIndexReverse(ip string) []*object.Service {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*object.Service
	for _, s := range f.svcs {
		if slices.Contains(s.ClusterIPs, ip) {
			out = append(out, s)
		}
	}
	return out
}

func (f *fakeAPI) EpIndex(idx string) []*object.Endpoints {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*object.Endpoints
	for _, e := range f.eps {
		if e.Index == idx {
			out = append(out, e)
		}
	}
	return out
}

func (f *fakeAPI) EpIndexReverse(ip string) []*object.Endpoints {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*object.Endpoints
	for _, e := range f.eps {
		if slices.Contains(e.IndexIP, ip) {
			out = append(out, e)
		}
	}
	return out
}

func (f *fakeAPI) Modified(kubernetes.ModifiedMode) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mod
}

func (f *fakeAPI) GetNamespaceByName(name string) (*object.Namespace, error) {
	return &object.Namespace{Name: name}, nil
}

func (f *fakeAPI) ServiceImportList() []*object.ServiceImport       { return nil }
func (f *fakeAPI) SvcExtIndexReverse(string) []*object.Service      { return nil }
func (f *fakeAPI) SvcImportIndex(string) []*object.ServiceImport    { return nil }
func (f *fakeAPI) PodIndex(string) []*object.Pod                    { return nil }
func (f *fakeAPI) McEpIndex(string) []*object.MultiClusterEndpoints { return nil }
func (f *fakeAPI) GetNodeByName(context.Context, string) (*api.Node, error) {
	return nil, errors.New("no nodes")
}
func (f *fakeAPI) Run()            {}
func (f *fakeAPI) HasSynced() bool { return true }
func (f *fakeAPI) Stop() error     { return nil }

func clusterService(name string, ip string) *object.Service {
	return &object.Service{Name: name, Namespace: "ns", Index: object.ServiceKey(name, "ns"), ClusterIPs: []string{ip},
		Type: api.ServiceTypeClusterIP, Ports: []api.ServicePort{{Name: "http", Port: 80, Protocol: api.ProtocolTCP}}}
}

func clusterSlice(service string, ips ...string) *object.Endpoints {
	e := &object.Endpoints{Name: service + "-1", Namespace: "ns", Index: object.EndpointsKey(service, "ns"),
		Subsets: []object.EndpointSubset{{Ports: []object.EndpointPort{{Name: "pg", Port: 5432, Protocol: "TCP"}}}}}
	for _, ip := range ips {
		e.Subsets[0].Addresses = append(e.Subsets[0].Addresses, object.EndpointAddress{IP: ip})
		e.IndexIP = append(e.IndexIP, ip)
	}
	return e
}

// kubeCache returns a cache with the kubernetes option in front of the
// real kubernetes plugin (ttl 30, as cluster DNS is cached again), whose
// controller is the fakeAPI it returns, and the invalidation following
// it, stopped when the test ends. record, when not nil, sees each flush
// before the cache applies it.
func kubeCache(t *testing.T, record func(flush.Flush)) (*Cache, *fakeAPI, *kube.Invalidator) {
	t.Helper()
	c := caddy.NewTestController("dns", "kubernetes cluster.local in-addr.arpa {\n ttl 30\n}")
	c.Next()
	k, err := kubernetes.ParseStanza(c)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeAPI{}
	k.APIConn = fake
	cc := caddy.NewTestController("dns", "compactcache {\n kubernetes\n}")
	cc.ServerBlockKeys = []string{"."}
	s, err := config.Parse(cc)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := newCache(s)
	if err != nil {
		t.Fatal(err)
	}
	ca.Next = k
	inv, err := kube.Start(ca.Kubernetes, []plugin.Handler{k}, kube.Target{Zones: ca.Zones, Flush: func(f flush.Flush) admin.Counts {
		if record != nil {
			record(f)
		}
		return ca.Flush(f)
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inv.Stop)
	for deadline := time.Now().Add(time.Second); !inv.Stats().Connected; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not following the fake controller a second after the start")
		}
	}
	return ca, fake, inv
}

// TestKubernetesInvalidation runs a cache in front of the real kubernetes
// plugin (ttl 30, as cluster DNS is cached again), whose controller is
// fakeAPI: what a change makes wrong answers anew within a second,
// NXDOMAIN and PTR answers included, and what it does not stays cached.
func TestKubernetesInvalidation(t *testing.T) {
	var flushes []flush.Flush
	var mu sync.Mutex
	ca, fake, inv := kubeCache(t, func(f flush.Flush) {
		mu.Lock()
		flushes = append(flushes, f)
		mu.Unlock()
	})

	query := func(name string, qtype uint16) []string {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		r := ask(t, ca, m, false)
		for _, rr := range r.Answer {
			if ttl := rr.Header().Ttl; ttl > 30 || ttl < 28 {
				t.Errorf("%s: TTL %d, want the plugin's 30 counting down", rr, ttl)
			}
		}
		return summary(r)
	}
	// within asks name until it answers want, for a second at most, and
	// says how long it took.
	within := func(what, name string, qtype uint16, want ...string) {
		t.Helper()
		start := time.Now()
		var got []string
		for time.Since(start) < 2*time.Second {
			if got = query(name, qtype); slices.Equal(got, want) {
				took := time.Since(start)
				if took > time.Second {
					t.Errorf("%s: %s %s answered %q %v after the change, want within 1s", what, name, dns.TypeToString[qtype], want, took)
				}
				t.Logf("%s: %s %s fresh %v after the change", what, name, dns.TypeToString[qtype], took.Round(time.Millisecond))
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("%s: %s %s still %q 2s after the change, want %q", what, name, dns.TypeToString[qtype], got, want)
	}
	const web = "web.ns.svc.cluster.local."

	// A name asked before its Service exists: cached NXDOMAIN, a hit.
	if got := query(web, dns.TypeA); got[0] != "NXDOMAIN" {
		t.Fatalf("web before its Service: %q, want NXDOMAIN", got)
	}
	fake.mu.Lock()
	asks := fake.asks
	fake.mu.Unlock()
	query(web, dns.TypeA)
	if fake.asks != asks {
		t.Fatalf("the second ask of web reached the plugin: not cached")
	}
	fake.setService(clusterService("web", "10.96.0.10"), false)
	within("Service created", web, dns.TypeA, "NOERROR", web+" A 10.96.0.10")
	within("Service created", "10.0.96.10.in-addr.arpa.", dns.TypePTR, "NOERROR", "10.0.96.10.in-addr.arpa. PTR "+web)

	// An unrelated name cached meanwhile stays cached through changes.
	other := "other.ns.svc.cluster.local."
	query(other, dns.TypeA)

	// Deleted and created again with another ClusterIP.
	fake.setService(clusterService("web", "10.96.0.10"), true)
	fake.setService(clusterService("web", "10.96.0.20"), false)
	within("Service recreated", web, dns.TypeA, "NOERROR", web+" A 10.96.0.20")
	within("Service recreated", "10.0.96.10.in-addr.arpa.", dns.TypePTR, "NXDOMAIN")
	within("Service recreated", "20.0.96.10.in-addr.arpa.", dns.TypePTR, "NOERROR", "20.0.96.10.in-addr.arpa. PTR "+web)

	// A headless Service's EndpointSlice changed.
	const db = "db.ns.svc.cluster.local."
	hl := clusterService("db", api.ClusterIPNone)
	fake.setService(hl, false)
	fake.setEndpoints(clusterSlice("db", "10.1.0.1", "10.1.0.2"))
	within("headless Service created", db, dns.TypeA, "NOERROR", db+" A 10.1.0.1", db+" A 10.1.0.2")
	fake.setEndpoints(clusterSlice("db", "10.1.0.1", "10.1.0.3"))
	within("EndpointSlice changed", db, dns.TypeA, "NOERROR", db+" A 10.1.0.1", db+" A 10.1.0.3")
	within("EndpointSlice changed", "10-1-0-3.db.ns.svc.cluster.local.", dns.TypeA, "NOERROR", "10-1-0-3.db.ns.svc.cluster.local. A 10.1.0.3")

	fake.mu.Lock()
	asks = fake.asks
	fake.mu.Unlock()
	query(other, dns.TypeA)
	if fake.asks != asks {
		t.Errorf("%s, which no change named, reached the plugin again: flushed", other)
	}
	mu.Lock()
	for _, f := range flushes {
		for _, n := range f.Names {
			if txt, _, _ := dns.UnpackDomainName(n, 0); txt == other {
				t.Errorf("%s flushed by %v", other, f.String())
			}
		}
	}
	mu.Unlock()
	st := inv.Stats()
	// A deletion and a creation, or a slice's creation and change, may
	// fall in one diff: one change.
	if st.Services < 3 || st.Services > 4 || st.Endpoints < 1 || st.Endpoints > 2 || st.Dropped.Denial == 0 || st.Source != "kubernetes plugin" || !st.Connected {
		t.Errorf("stats %+v: want 3 or 4 Service changes, 1 or 2 EndpointSlice changes, denials dropped, connected to the kubernetes plugin", st)
	}
}

// TestKubernetesExternalNameSwitch: a Service switched from ClusterIP to
// ExternalName keeps its EndpointSlice (the EndpointSlice controller
// leaves it), and the plugin answers its endpoints' names NXDOMAIN; back
// to ClusterIP, it answers them again. Each answer is fresh within a
// second of the switch.
func TestKubernetesExternalNameSwitch(t *testing.T) {
	ca, fake, _ := kubeCache(t, nil)
	const ep = "10-1-1-1.web.ns.svc.cluster.local."
	fake.setService(clusterService("web", "10.96.0.10"), false)
	fake.setEndpoints(clusterSlice("web", "10.1.1.1"))
	freshWithin(t, ca, "a ClusterIP Service with an endpoint", ep, dns.TypeA, "NOERROR", ep+" A 10.1.1.1")
	cacheSettled(t, ca, fake, ep, dns.TypeA)
	ext := &object.Service{Name: "web", Namespace: "ns", Index: object.ServiceKey("web", "ns"), ClusterIPs: []string{""},
		Type: api.ServiceTypeExternalName, ExternalName: "www.example.org", Ports: []api.ServicePort{{Port: -1}}}
	fake.setService(ext, false)
	freshWithin(t, ca, "switched to ExternalName", ep, dns.TypeA, "NXDOMAIN")
	cacheSettled(t, ca, fake, ep, dns.TypeA)
	fake.setService(clusterService("web", "10.96.0.11"), false)
	freshWithin(t, ca, "switched back to ClusterIP", ep, dns.TypeA, "NOERROR", ep+" A 10.1.1.1")
}

// TestKubernetesAliasOfClusterName: an ExternalName Service whose target
// is a cluster name is answered by the plugin with the CNAME and the
// target's records, cached under the alias's name: a change of the target
// makes the alias's answer fresh within a second too.
func TestKubernetesAliasOfClusterName(t *testing.T) {
	ca, fake, _ := kubeCache(t, nil)
	const web, alias = "web.ns.svc.cluster.local.", "alias.other.svc.cluster.local."
	fake.setService(clusterService("web", "10.96.0.10"), false)
	fake.setService(&object.Service{Name: "alias", Namespace: "other", Index: object.ServiceKey("alias", "other"), ClusterIPs: []string{""},
		Type: api.ServiceTypeExternalName, ExternalName: web, Ports: []api.ServicePort{{Port: -1}}}, false)
	freshWithin(t, ca, "an alias of web", alias, dns.TypeA, "NOERROR", alias+" CNAME "+web, web+" A 10.96.0.10")
	cacheSettled(t, ca, fake, alias, dns.TypeA)
	fake.setService(clusterService("web", "10.96.0.10"), true)
	fake.setService(clusterService("web", "10.96.0.20"), false)
	freshWithin(t, ca, "web recreated at another address", alias, dns.TypeA, "NOERROR", alias+" CNAME "+web, web+" A 10.96.0.20")
}

// TestKubernetesTypeWithoutName: a name flush probes the types miekg/dns
// names, so the cache keeps no answer to a query of another type, which
// would outlive every flush of its name: the NXDOMAIN of a Service not yet
// created is asked again once it is.
func TestKubernetesTypeWithoutName(t *testing.T) {
	ca, fake, _ := kubeCache(t, nil)
	const web = "web.ns.svc.cluster.local."
	for _, qt := range []uint16{dns.TypeHTTPS, 65280} {
		freshWithin(t, ca, "no Service yet", web, qt, "NXDOMAIN")
	}
	cacheSettled(t, ca, fake, web, dns.TypeHTTPS)
	fake.setService(clusterService("web", "10.96.0.10"), false)
	for _, qt := range []uint16{dns.TypeHTTPS, 65280} {
		freshWithin(t, ca, "the Service created", web, qt, "NOERROR")
	}
}

// summary returns r's rcode, then its answer's records as "owner TYPE
// rdata", sorted.
func summary(r *dns.Msg) []string {
	out := []string{dns.RcodeToString[r.Rcode]}
	for _, rr := range r.Answer {
		f := strings.Fields(rr.String())
		out = append(out, f[0]+" "+strings.Join(f[3:], " "))
	}
	slices.Sort(out[1:])
	return out
}

// TestKubernetesNameserver: the apex NS answer, which lists the Service of
// the EndpointSlice holding one of the plugin's local IPs, or else those
// addresses as ns.dns, is answered anew once such a slice comes. The
// plugin sets its local IPs at its startup, after the cache's source has
// started (compactcache comes first in the directive order), as here.
func TestKubernetesNameserver(t *testing.T) {
	ca, fake, _ := kubeCache(t, nil)
	f := reflect.ValueOf(ca.Next).Elem().FieldByName("localIPs")
	reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Set(reflect.ValueOf([]net.IP{net.ParseIP("10.1.0.1")}))
	const apex = "cluster.local."
	freshWithin(t, ca, "no slice of the nameserver", apex, dns.TypeNS, "NOERROR", apex+" NS ns.dns."+apex)
	cacheSettled(t, ca, fake, apex, dns.TypeNS)
	fake.setService(clusterService("dns", "10.96.0.10"), false)
	fake.setEndpoints(clusterSlice("dns", "10.1.0.1"))
	freshWithin(t, ca, "the nameserver's slice came", apex, dns.TypeNS, "NOERROR", apex+" NS dns.ns.svc."+apex)
}

// TestKubernetesNameserverKnown: once the block's servers are up, the
// plugin's addresses are known, and a slice that holds none of them
// leaves the apex NS answer cached, which one that holds one flushes.
func TestKubernetesNameserverKnown(t *testing.T) {
	ca, fake, inv := kubeCache(t, nil)
	f := reflect.ValueOf(ca.Next).Elem().FieldByName("localIPs")
	reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Set(reflect.ValueOf([]net.IP{net.ParseIP("10.1.0.1")}))
	inv.Started()
	const apex = "cluster.local."
	fake.setService(clusterService("dns", "10.96.0.10"), false)
	fake.setEndpoints(clusterSlice("dns", "10.1.0.1"))
	freshWithin(t, ca, "the nameserver's slice came", apex, dns.TypeNS, "NOERROR", apex+" NS dns.ns.svc."+apex)
	cacheSettled(t, ca, fake, apex, dns.TypeNS)
	fake.setService(clusterService("web", "10.96.0.20"), false)
	fake.setEndpoints(clusterSlice("web", "10.1.0.5"))
	if nsAsked(t, ca, fake) {
		t.Errorf("the apex NS answer flushed by a slice without the nameserver's address")
	}
	fake.setEndpoints(clusterSlice("dns", "10.1.0.1", "10.1.0.2"))
	if !nsAsked(t, ca, fake) {
		t.Errorf("the apex NS answer still cached after the nameserver's slice changed")
	}
}

// nsAsked reports whether the apex NS answer, asked once the flushes of
// the changes just made passed, came from the plugin rather than the
// cache.
func nsAsked(t *testing.T, ca *Cache, fake *fakeAPI) bool {
	t.Helper()
	time.Sleep(300 * time.Millisecond)
	fake.mu.Lock()
	asks := fake.asks
	fake.mu.Unlock()
	m := new(dns.Msg)
	m.SetQuestion("cluster.local.", dns.TypeNS)
	ask(t, ca, m, false)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	return fake.asks != asks
}

// cacheSettled waits for the flushes of the changes just made to pass,
// then asks ca for name/qtype until it is cached, for the next change to
// make fresh.
func cacheSettled(t *testing.T, ca *Cache, fake *fakeAPI, name string, qtype uint16) {
	t.Helper()
	time.Sleep(300 * time.Millisecond)
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	ask(t, ca, m, false)
	fake.mu.Lock()
	asks := fake.asks
	fake.mu.Unlock()
	ask(t, ca, m, false)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.asks != asks {
		t.Fatalf("%s %s is not cached", name, dns.Type(qtype))
	}
}

// freshWithin asks ca for name/qtype until it answers want, the rcode and
// then the answer's records as "owner TYPE rdata", sorted, for up to a
// second past the answer's first query. The answer is asked for again once
// it came, so that it is then cached.
func freshWithin(t *testing.T, ca *Cache, what, name string, qtype uint16, want ...string) {
	t.Helper()
	query := func() []string {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		return summary(ask(t, ca, m, false))
	}
	var got []string
	for start := time.Now(); time.Since(start) < time.Second; time.Sleep(10 * time.Millisecond) {
		if got = query(); slices.Equal(got, want) {
			query()
			return
		}
	}
	t.Errorf("%s: %s %s is %q a second on, want %q", what, name, dns.Type(qtype), got, want)
}

// TestKubernetesOptionErrors: a block whose kubernetes option cannot work
// does not start, and says what to write instead.
func TestKubernetesOptionErrors(t *testing.T) {
	for _, tc := range []struct{ corefile, want string }{
		{".:0 {\n bind 127.0.0.1\n compactcache {\n  kubernetes\n }\n whoami\n}\n", "no kubernetes plugin after compactcache to follow"},
		{".:0 {\n bind 127.0.0.1\n compactcache {\n  kubernetes\n  kubernetes\n }\n whoami\n}\n", "kubernetes: can only be given once"},
		{".:0 {\n bind 127.0.0.1\n compactcache {\n  kubernetes {\n   endpoint_pod_names\n  }\n }\n whoami\n}\n", "the root zone is not a cluster's"},
	} {
		err := startError(tc.corefile)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error saying %q", tc.corefile, err, tc.want)
		}
	}
}

// BenchmarkKubernetesFlush is the cache's share of a cluster change: the
// Flush of the names a ClusterIP Service's change makes wrong (its name,
// its port's name, the PTR names of its old and new address), each probed
// under every key its entries may be stored under, in a cache holding
// 10,000 Services' answers from the kubernetes plugin.
func BenchmarkKubernetesFlush(b *testing.B) {
	c := caddy.NewTestController("dns", "kubernetes cluster.local in-addr.arpa {\n ttl 30\n}")
	c.Next()
	k, err := kubernetes.ParseStanza(c)
	if err != nil {
		b.Fatal(err)
	}
	fake := &fakeAPI{}
	k.APIConn = fake
	ca := New()
	ca.Next = k
	const services = 10000
	name := func(i int) string { return fmt.Sprintf("s%d.ns.svc.cluster.local.", i) }
	for i := range services {
		fake.svcs = append(fake.svcs, clusterService(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.%d.%d", i/250, i%250)))
	}
	for i := range services {
		m := new(dns.Msg)
		m.SetQuestion(name(i), dns.TypeA)
		ask(b, ca, m, false)
	}
	if st := ca.Stats(); st.Entries < services {
		b.Fatalf("%d entries stored, want %d", st.Entries, services)
	}
	wire := func(s string) []byte {
		buf := make([]byte, 255)
		n, err := dns.PackDomainName(s, buf, 0, nil, false)
		if err != nil {
			b.Fatal(err)
		}
		return buf[:n]
	}
	var flushes []flush.Flush
	for i := range services {
		flushes = append(flushes, flush.Flush{Scope: flush.Names, Names: [][]byte{
			wire(name(i)), wire("_http._tcp." + name(i)),
			wire(fmt.Sprintf("%d.%d.96.10.in-addr.arpa.", i%250, i/250)), wire(fmt.Sprintf("%d.%d.97.10.in-addr.arpa.", i%250, i/250)),
		}})
	}
	dropped := int64(0)
	i := 0
	for b.Loop() {
		dropped += ca.Flush(flushes[i%services]).Total()
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i)/4, "ns/name")
	if i >= services && dropped < services {
		b.Errorf("%d entries dropped by %d flushes of the 10,000 Services' names, want each Service's A", dropped, i)
	}
}

// TestKubernetesFailedReloadKeepsSource: a reload that fails (a block on a
// port another process holds) leaves the running instance serving, with
// its source: caddy runs the old instance's hook for the failure, which
// must stop the failed instance's source, not its own. A reload that
// succeeds then leaves the new instance's source alone running.
func TestKubernetesFailedReloadKeepsSource(t *testing.T) {
	// A watch of its own, of an API server that is not there: the source
	// runs, and reconnects, as it would while the API server is down.
	corefile := func(ttl string) string {
		return ".:0 {\n\tbind 127.0.0.1\n\tcompactcache " + ttl + " {\n\t\tkubernetes cluster.local {\n\t\t\tendpoint http://127.0.0.1:1\n\t\t}\n\t}\n\twhoami\n}\n"
	}
	sources := kube.Running
	inst, err := startCorefile(corefile(""))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopInstance(inst) }()
	first := sources()
	if len(first) != 1 {
		t.Fatalf("%d sources running, want the block's one", len(first))
	}

	inst = failReload(t, inst, corefile("600")+onTakenPort(t))
	if got := sources(); len(got) != 1 || got[0] != first[0] {
		t.Errorf("after a failed reload, %d sources run, the running block's among them: %v; want it alone", len(got), slices.Contains(got, first[0]))
	}

	serverMu.Lock()
	inst, err = inst.Restart(corefileInput(corefile("600")))
	serverMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if got := sources(); len(got) != 1 || got[0] == first[0] {
		t.Errorf("after a reload, %d sources run, the old block's among them: %v; want the new block's alone", len(got), slices.Contains(got, first[0]))
	}
}

func TestKubernetesSourceRunsThroughLameduck(t *testing.T) {
	// health's lameduck runs among the shutdown callbacks, while the
	// servers still answer: the source must still drop what changes then.
	inst, err := startCorefile(".:0 {\n\tbind 127.0.0.1\n\tcompactcache {\n\t\tkubernetes cluster.local {\n\t\t\tendpoint http://127.0.0.1:1\n\t\t}\n\t}\n\twhoami\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(kube.Running()); n != 1 {
		t.Fatalf("%d sources running, want the block's one", n)
	}
	stopServers(inst)
	for _, shutdown := range inst.OnShutdown {
		shutdown()
	}
	if n := len(kube.Running()); n != 1 {
		t.Errorf("%d sources running after the shutdown callbacks, want the block's one until the final ones", n)
	}
	lifecycle.Stop(inst)
	if n := len(kube.Running()); n != 0 {
		t.Errorf("%d sources running after the instance stopped, want none", n)
	}
}
