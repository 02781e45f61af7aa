package compactcache

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/kube"
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

// TestKubernetesInvalidation runs a cache in front of the real kubernetes
// plugin (ttl 30, as cluster DNS is cached again), whose controller is
// fakeAPI: what a change makes wrong answers anew within a second,
// NXDOMAIN and PTR answers included, and what it does not stays cached.
func TestKubernetesInvalidation(t *testing.T) {
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
	var flushes []flush.Flush
	var mu sync.Mutex
	inv, err := kube.Start(ca.Kubernetes, []plugin.Handler{k}, kube.Target{Zones: ca.Zones, Flush: func(f flush.Flush) admin.Counts {
		mu.Lock()
		flushes = append(flushes, f)
		mu.Unlock()
		return ca.Flush(f)
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer inv.Stop()
	for deadline := time.Now().Add(time.Second); !inv.Stats().Connected; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not following the fake controller a second after the start")
		}
	}

	query := func(name string, qtype uint16) []string {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		r := ask(t, ca, m, false)
		out := []string{dns.RcodeToString[r.Rcode]}
		for _, rr := range r.Answer {
			f := strings.Fields(rr.String())
			out = append(out, f[0]+" "+strings.Join(f[3:], " "))
			if ttl := rr.Header().Ttl; ttl > 30 || ttl < 28 {
				t.Errorf("%s: TTL %d, want the plugin's 30 counting down", rr, ttl)
			}
		}
		slices.Sort(out[1:])
		return out
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
