package kube

import (
	"fmt"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/kubernetes"
	"github.com/coredns/coredns/plugin/kubernetes/object"
	"k8s.io/client-go/tools/cache"
)

// indexerCtl lists from client-go indexers, as the kubernetes plugin's
// controller does (dnsControl.ServiceList, EndpointsList): the lists cost
// what they cost there.
type indexerCtl struct {
	svcs, eps cache.Indexer
}

func (c *indexerCtl) HasSynced() bool                        { return true }
func (c *indexerCtl) Modified(kubernetes.ModifiedMode) int64 { return 0 }
func (c *indexerCtl) GetNamespaceByName(ns string) (*object.Namespace, error) {
	return &object.Namespace{Name: ns}, nil
}

func (c *indexerCtl) ServiceList() []*object.Service { return listOf[*object.Service](c.svcs.List()) }
func (c *indexerCtl) EndpointsList() []*object.Endpoints {
	return listOf[*object.Endpoints](c.eps.List())
}

// listOf is the objects of an indexer's list that are Ts.
func listOf[T any](objs []any) []T {
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// cluster makes n Services in n/20 namespaces, one in ten headless, each
// with an EndpointSlice of three endpoints.
func cluster(n int) *indexerCtl {
	c := &indexerCtl{svcs: cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil), eps: cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil)}
	for i := range n {
		ns, name := fmt.Sprintf("ns%d", i/20), fmt.Sprintf("svc%d", i)
		var s *object.Service
		if i%10 == 0 {
			s = headless(ns, name, port("http", 80))
		} else {
			s = svc(ns, name, []string{fmt.Sprintf("10.96.%d.%d", i/250, i%250)}, port("http", 80))
		}
		_ = c.svcs.Add(s)
		_ = c.eps.Add(endpointsOf(ns, name, i, 0))
	}
	return c
}

// endpointsOf is Service i's slice, its third endpoint moved gen times.
func endpointsOf(ns, name string, i, gen int) *object.Endpoints {
	return slice(ns, name+"-1", name, eport("http", 8080),
		fmt.Sprintf("10.1.%d.%d", i/250, i%250), fmt.Sprintf("10.2.%d.%d", i/250, i%250),
		fmt.Sprintf("10.%d.%d.%d", 3+gen%200, i/250, i%250))
}

// BenchmarkFollowDiff is the cost of a diff of the kubernetes plugin's
// 10,000 Services and their EndpointSlices that finds changes endpoint
// moves: the lists, the lookups, the names of the changed ones. At 100
// changes a second, a diff every pollEvery finds 10; cpu-ms/s is what
// that rate costs a second.
func BenchmarkFollowDiff(b *testing.B) {
	const services = 10000
	for _, changes := range []int{0, 1, 10, 100} {
		b.Run(fmt.Sprintf("services=%d/changes=%d", services, changes), func(b *testing.B) {
			ctl := cluster(services)
			f := &follow{ctl: ctl, view: newClusterView(newNamer(clusterZones))}
			f.diff(nil)
			bt := newBatch(nil)
			gen, names := 0, 0
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for j := range changes {
					i := (gen*changes + j) * 7919 % services
					_ = ctl.eps.Update(endpointsOf(fmt.Sprintf("ns%d", i/20), fmt.Sprintf("svc%d", i), i, gen+1))
				}
				gen++
				b.StartTimer()
				f.diff(bt)
				names += len(bt.names) + len(bt.subtrees)
				bt.take()
			}
			perDiff := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if changes > 0 {
				b.ReportMetric(perDiff/float64(changes), "ns/change")
				b.ReportMetric(float64(names)/float64(b.N*changes), "names/change")
			}
			if changes == 10 {
				b.ReportMetric(perDiff*float64(time.Second/pollEvery)/1e6, "cpu-ms/s@100changes/s")
			}
		})
	}
}

// BenchmarkFollowDiffNamespaces is the cost of a diff that finds nothing
// where the plugin's namespaces option exposes one namespace of 500 and
// 100 ExternalName Services alias names: the Services of the others are
// passed over, not told to the view, which would walk the aliases for
// each.
func BenchmarkFollowDiffNamespaces(b *testing.B) {
	ctl := cluster(10000)
	for i := range 100 {
		_ = ctl.svcs.Add(external("ns0", fmt.Sprintf("alias%d", i), "www.example.org"))
	}
	v := newClusterView(newNamer(clusterZones))
	v.namespaces = map[string]struct{}{"ns0": {}}
	f := &follow{ctl: ctl, view: v}
	f.diff(nil)
	bt := newBatch(nil)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		f.diff(bt)
	}
}
