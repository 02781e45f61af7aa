package kube

import (
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/coredns/coredns/plugin/kubernetes/object"
	"github.com/miekg/dns"
	api "k8s.io/api/core/v1"
)

// clusterView is the Services and EndpointSlices as the last flush knew them.
// Told of an object's new state (Service, Endpoints), it adds to a batch
// the names whose answers the change makes wrong, and only those: a
// change the plugin's answers do not show (a label, a node name, the
// resource version alone) adds none. A view is not safe for concurrent use.
type clusterView struct {
	namer namer
	// namespaces, when not empty, are the only ones the plugin exposes
	// (its namespaces option): the others answer nothing that changes
	// but the nameserver's slices and Services (keepsSlice).
	namespaces map[string]struct{}
	// ignoreEmpty is the plugin's ignore empty_service: a ClusterIP
	// Service without endpoints answers NXDOMAIN.
	ignoreEmpty bool
	// servers are the nameserver's addresses, the plugin's local IPs: the
	// apex NS and ns.dns answers list the Services of the slices holding
	// one, or their endpoints where headless (ns.go). Nil while they are
	// unknown, and any address may be one: a watch of its own, in front
	// of a cluster DNS whose pods' they are, and the plugin until its
	// servers are up (Invalidator.Started). Stored by the block's start,
	// read by the view's events.
	servers atomic.Pointer[map[string]struct{}]

	svcs  map[string]*svcEntry // by object.ServiceKey
	eps   map[epKey]*epEntry
	bySvc map[string]map[epKey]*object.Endpoints // the slices of a Service, by its key
	perNS map[string]int                         // Services in each namespace
	// aliases are the ExternalName Services, by key: one whose target is
	// a cluster name is answered with the target's records (the plugin
	// resolves an in-zone target itself), cached under the alias's name.
	aliases map[string]alias
	gen     uint32 // the marks of a sweep (follow.go)
}

// alias is an ExternalName Service and its target, a lowercased wire name.
type alias struct {
	s      *object.Service
	target string
}

type svcEntry struct {
	s   *object.Service
	gen uint32
}

type epEntry struct {
	e   *object.Endpoints
	gen uint32
}

// epKey names an EndpointSlice: its namespace and name.
type epKey struct{ ns, name string }

func keyOf(e *object.Endpoints) epKey { return epKey{e.Namespace, e.Name} }

// newClusterView returns an empty view that names changes with n, and
// knows no nameserver's address.
func newClusterView(n namer) *clusterView {
	v := &clusterView{namer: n, svcs: map[string]*svcEntry{}, eps: map[epKey]*epEntry{},
		bySvc: map[string]map[epKey]*object.Endpoints{}, perNS: map[string]int{}, aliases: map[string]alias{}}
	v.setServers(map[string]struct{}{}) // none until told
	return v
}

func (v *clusterView) exposed(ns string) bool {
	if len(v.namespaces) == 0 {
		return true
	}
	_, ok := v.namespaces[ns]
	return ok
}

// keepsSlice reports whether the view keeps e: a slice of a namespace the
// plugin exposes, or one holding a known nameserver's address whatever
// its namespace, as nsAddrs finds those whatever the namespaces option
// says. Their other names answer nothing there, and are flushed needlessly
// as they change, which is seldom. While the addresses are unknown, any
// address may be one and that would keep every slice: none of another
// namespace is kept, and the follow's first diff once they are known
// keeps the nameserver's, flushing the apexes.
func (v *clusterView) keepsSlice(e *object.Endpoints) bool {
	return v.exposed(e.Namespace) || v.servers.Load() != nil && v.holdsServer(e)
}

// keepsService reports whether the view keeps s, the Service of key: one
// of a namespace the plugin exposes, or one nsAddrs lists, of a kept slice
// holding a nameserver's address. The follow's diff tells the Services
// first: it keeps the Service one diff after the slice, flushing the
// apexes again.
func (v *clusterView) keepsService(key string, s *object.Service) bool {
	return v.exposed(s.Namespace) || v.serves(key)
}

// Service records the Service of key's new state s, nil once deleted,
// adding what the change makes wrong to b (nil while the view is first
// filled, when nothing cached is known to be wrong).
func (v *clusterView) Service(b *batch, key string, s *object.Service) {
	if b != nil {
		defer v.aliasNames(b)
	}
	var old *object.Service
	if e := v.svcs[key]; e != nil {
		old = e.s
	}
	if s != nil && !v.keepsService(key, s) {
		s = nil
	}
	delete(v.aliases, key)
	if s != nil && s.Type == api.ServiceTypeExternalName {
		var buf [dnsmsg.MaxNameLen]byte
		if n, err := dnsmsg.PackName(strings.ToLower(dns.Fqdn(s.ExternalName)), buf[:]); err == nil {
			v.aliases[key] = alias{s, string(buf[:n])}
		}
	}
	switch {
	case old == nil && s == nil:
		return
	case s == nil:
		delete(v.svcs, key)
	case old == nil:
		v.svcs[key] = &svcEntry{s: s, gen: v.gen}
	default:
		v.svcs[key].s = s
		if sameService(old, s) {
			return
		}
	}
	if (old == nil) != (s == nil) {
		v.count(b, cmp(old, s).Namespace, cmp(old, s) == s)
	}
	if b == nil {
		return
	}
	b.changes[kindService]++
	if v.serves(key) {
		v.namer.nameservers(b)
	}
	for _, x := range []*object.Service{old, s} {
		if x != nil {
			v.namer.service(b, x)
		}
	}
	if answersEndpoints(old) != answersEndpoints(s) {
		// The endpoints' names answer only while their Service exists
		// and is not an ExternalName one (the EndpointSlice controller
		// leaves the slices of a Service switched to ExternalName).
		x := cmp(old, s)
		v.endpointNames(b, key, x, old != nil && old.Headless() || s != nil && s.Headless())
	}
}

// endpointNames adds the names of the endpoints of x, the Service of key,
// and where headless the port names its slices answer for, which need not
// be its own (a selector-less Service's slices name their ports).
func (v *clusterView) endpointNames(b *batch, key string, x *object.Service, headless bool) {
	for _, e := range v.bySvc[key] {
		if headless {
			v.namer.serviceNames(b, x.Name, x.Namespace, portsOf(e))
		}
		for _, ss := range e.Subsets {
			for _, a := range ss.Addresses {
				v.namer.endpoint(b, a, x.Name, x.Namespace)
			}
		}
	}
}

// answersEndpoints reports whether the plugin answers the names of the
// endpoints of s (nil: deleted): findServices skips them for ExternalName.
func answersEndpoints(s *object.Service) bool {
	return s != nil && s.Type != api.ServiceTypeExternalName
}

// cmp is the one of a and b that is not nil.
func cmp[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

// count counts a Service added to (up) or gone from namespace ns: the
// namespace's own names change when its first Service comes or its last
// goes, which is as near as Services tell to its creation and deletion.
func (v *clusterView) count(b *batch, ns string, up bool) {
	if up {
		v.perNS[ns]++
		if v.perNS[ns] > 1 {
			return
		}
	} else {
		v.perNS[ns]--
		if v.perNS[ns] > 0 {
			return
		}
		delete(v.perNS, ns)
	}
	if b != nil {
		b.changes[kindNamespace]++
		v.namer.namespace(b, ns)
	}
}

// sameService reports whether a and b answer the same: the fields of a
// Service the plugin reads for the cluster zones.
func sameService(a, b *object.Service) bool {
	return a.Type == b.Type && a.ExternalName == b.ExternalName &&
		slices.Equal(a.ClusterIPs, b.ClusterIPs) &&
		slices.EqualFunc(a.Ports, b.Ports, func(p, q api.ServicePort) bool {
			return p.Name == q.Name && p.Port == q.Port && p.Protocol == q.Protocol
		})
}

// Endpoints records the EndpointSlice's new state e (nil once deleted;
// key names it either way), adding what the change makes wrong to b (nil
// while the view is first filled).
func (v *clusterView) Endpoints(b *batch, key epKey, e *object.Endpoints) {
	if b != nil {
		defer v.aliasNames(b)
	}
	var old *object.Endpoints
	if x := v.eps[key]; x != nil {
		old = x.e
	}
	if e != nil && !v.keepsSlice(e) {
		e = nil
	}
	switch {
	case old == nil && e == nil:
		return
	case e == nil:
		delete(v.eps, key)
	case old == nil:
		v.eps[key] = &epEntry{e: e, gen: v.gen}
	default:
		v.eps[key].e = e
	}
	if old != nil {
		if m := v.bySvc[old.Index]; m != nil {
			delete(m, key)
			if len(m) == 0 {
				delete(v.bySvc, old.Index)
			}
		}
	}
	if e != nil {
		m := v.bySvc[e.Index]
		if m == nil {
			m = map[epKey]*object.Endpoints{}
			v.bySvc[e.Index] = m
		}
		m[key] = e
	}
	if b == nil || old != nil && e != nil && v.sameEndpoints(old, e) {
		return
	}
	b.changes[kindEndpoints]++
	if v.holdsServer(old) || v.holdsServer(e) {
		v.namer.nameservers(b)
	}
	if old == nil || e == nil || old.Index != e.Index {
		for _, x := range []*object.Endpoints{old, e} {
			if x != nil {
				v.endpointsNames(b, x, nil, true)
			}
		}
		return
	}
	v.endpointsNames(b, e, old, !slices.Equal(portsOf(old), portsOf(e)))
}

// endpointsNames adds the names a change of an EndpointSlice from old to
// e makes wrong (e's alone when old is nil): the names of the endpoints
// whose address or name changed, or of all of them when all is set (the
// ports changed), and the PTR names of the changed ones; and the
// Service's names where its answer is made of endpoints.
func (v *clusterView) endpointsNames(b *batch, e, old *object.Endpoints, all bool) {
	var svc *object.Service
	if x := v.svcs[e.Index]; x != nil {
		svc = x.s
	}
	name := svcName(e)
	changed := pairs(v, e)
	named := changed
	if old != nil {
		before := pairs(v, old)
		if all {
			named = maps.Clone(changed)
			maps.Copy(named, before)
		}
		for p := range before {
			if _, ok := changed[p]; ok {
				delete(changed, p)
				delete(before, p)
			}
		}
		maps.Copy(changed, before)
		if !all {
			named = changed
		}
	}
	for p := range changed {
		v.namer.ptr(b, p.ip)
	}
	if svc != nil {
		// Named endpoints exist only while their Service does; the
		// Service's coming names them (Service).
		for p := range named {
			v.namer.endpoint(b, object.EndpointAddress{IP: p.ip, Hostname: p.host}, name, e.Namespace)
		}
	}
	zones := v.namer.Zonal && old != nil && !maps.Equal(old.Zones, e.Zones)
	if svc == nil || svc.Type == api.ServiceTypeExternalName || len(changed) == 0 && !all && !zones {
		return
	}
	ports := portsOf(e)
	if old != nil {
		ports = append(slices.Clone(ports), portsOf(old)...)
	}
	switch {
	case svc.Headless():
		// A headless Service's records are its endpoints'.
		v.namer.serviceNames(b, name, e.Namespace, ports)
	case v.ignoreEmpty && (old == nil || (addresses(old) == 0) != (addresses(e) == 0)):
		// Under ignore empty_service a Service with no endpoints is
		// NXDOMAIN: the Service's names change as its first endpoint comes
		// or its last goes.
		v.namer.service(b, svc)
	}
}

// serves reports whether a slice of the Service of key holds a
// nameserver's address: the Service's names and addresses are then in the
// apex NS and ns.dns answers.
func (v *clusterView) serves(key string) bool {
	for _, e := range v.bySvc[key] {
		if v.holdsServer(e) {
			return true
		}
	}
	return false
}

// holdsServer reports whether e (nil: none) holds a nameserver's address.
func (v *clusterView) holdsServer(e *object.Endpoints) bool {
	if e == nil {
		return false
	}
	servers := v.servers.Load()
	for _, ss := range e.Subsets {
		for _, a := range ss.Addresses {
			if servers == nil {
				return true
			}
			if _, ok := (*servers)[a.IP]; ok {
				return true
			}
		}
	}
	return false
}

// setServers makes servers the nameserver's addresses; nil: unknown.
func (v *clusterView) setServers(servers map[string]struct{}) {
	if servers == nil {
		v.servers.Store(nil)
		return
	}
	v.servers.Store(&servers)
}

// pair is an endpoint as its names show it: its address, and the first
// label of its name.
type pair struct{ ip, host string }

func pairs(v *clusterView, e *object.Endpoints) map[pair]struct{} {
	m := map[pair]struct{}{}
	if e == nil {
		return m
	}
	for _, ss := range e.Subsets {
		for _, a := range ss.Addresses {
			m[pair{a.IP, v.namer.hostname(a)}] = struct{}{}
		}
	}
	return m
}

func addresses(e *object.Endpoints) int {
	n := 0
	for _, ss := range e.Subsets {
		n += len(ss.Addresses)
	}
	return n
}

func portsOf(e *object.Endpoints) []object.EndpointPort {
	if len(e.Subsets) == 1 {
		return e.Subsets[0].Ports
	}
	var ps []object.EndpointPort
	for _, ss := range e.Subsets {
		ps = append(ps, ss.Ports...)
	}
	return ps
}

// sameEndpoints reports whether a and b answer the same: the same Service,
// ports, endpoint addresses and names, in the same order, and under the
// zonal option the same zones.
func (v *clusterView) sameEndpoints(a, b *object.Endpoints) bool {
	if a.Index != b.Index || len(a.Subsets) != len(b.Subsets) || v.namer.Zonal && !maps.Equal(a.Zones, b.Zones) {
		return false
	}
	for i := range a.Subsets {
		sa, sb := a.Subsets[i], b.Subsets[i]
		if !slices.Equal(sa.Ports, sb.Ports) || !slices.EqualFunc(sa.Addresses, sb.Addresses, func(x, y object.EndpointAddress) bool {
			return x.IP == y.IP && v.namer.hostname(x) == v.namer.hostname(y)
		}) {
			return false
		}
	}
	return true
}

// svcName is the name of e's Service: the first label of its index
// (object.EndpointsKey), as Service names hold no dots.
func svcName(e *object.Endpoints) string {
	for i := 0; i < len(e.Index); i++ {
		if e.Index[i] == '.' {
			return e.Index[:i]
		}
	}
	return e.Index
}

// namespaceNames adds the names of every Service of namespace ns and of
// their endpoints, and under the namespaces option the PTR names of its
// endpoints: all of them answer only while the namespace is exposed. It
// walks the view: a namespace appears or goes seldom.
func (v *clusterView) namespaceNames(b *batch, ns string) {
	for key, e := range v.svcs {
		if e.s.Namespace != ns {
			continue
		}
		v.namer.service(b, e.s)
		v.endpointNames(b, key, e.s, e.s.Headless())
	}
	if len(v.namespaces) == 0 {
		// The plugin answers an endpoint's PTR query until its slice
		// goes, whatever its namespace's state, but under its namespaces
		// option only while the namespace exists (serviceRecordForIP).
		return
	}
	for _, e := range v.eps {
		if e.e.Namespace != ns {
			continue
		}
		for _, ss := range e.e.Subsets {
			for _, a := range ss.Addresses {
				v.namer.ptr(b, a.IP)
			}
		}
	}
}

// aliasNames adds the names of the ExternalName Services whose target is a
// name b's changes named, or lies under a subtree they named, and so on
// along chains of aliases: their cached answers hold the target's records,
// whether or not the cache's zones hold the target.
func (v *clusterView) aliasNames(b *batch) {
	for n := -1; n != len(b.names)+len(b.outNames); {
		n = len(b.names) + len(b.outNames)
		for _, a := range v.aliases {
			if b.drops(a.target) {
				v.namer.service(b, a.s)
			}
		}
	}
	clear(b.outNames)
	clear(b.outTrees)
}

// rebase makes v, filled with no batch, the view base holds told of v's
// objects, adding to b what changed between them: base is a stopped
// source's last view (handoff.go), which v takes over, keeping its own
// namer and options.
func (v *clusterView) rebase(b *batch, base *clusterView) {
	svcs, eps := v.svcs, v.eps
	v.svcs, v.eps, v.bySvc, v.perNS, v.aliases = base.svcs, base.eps, base.bySvc, base.perNS, base.aliases
	for k, e := range svcs {
		v.Service(b, k, e.s)
	}
	for k := range v.svcs {
		if svcs[k] == nil {
			v.Service(b, k, nil)
		}
	}
	for k, e := range eps {
		v.Endpoints(b, k, e.e)
	}
	for k := range v.eps {
		if eps[k] == nil {
			v.Endpoints(b, k, nil)
		}
	}
	// The marks of base's sweeps are not v's.
	for _, e := range v.svcs {
		e.gen = v.gen
	}
	for _, e := range v.eps {
		e.gen = v.gen
	}
}
