package kube

import (
	"strings"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/coredns/coredns/plugin/kubernetes/object"
	"github.com/miekg/dns"
)

// namer makes the names the kubernetes plugin answers for an object, as
// its kubernetes.go, reverse.go and parse.go spell them.
type namer struct {
	// Zones are the cluster domains names are made under, each lowercased
	// and fully qualified: the plugin's non-reverse zones.
	Zones []string
	// Reverse holds the zones PTR names must fall in to be made: the
	// plugin answers PTR queries only in its own zones.
	Reverse dnsmsg.ZoneSet
	// PodNames is endpoint_pod_names: an endpoint without a hostname is
	// named after its pod rather than its address.
	PodNames bool
	// Zonal is the plugin's zonal option: the zone-scoped names of a
	// headless Service (ZONE.pin._zone.SERVICE...) change with its
	// endpoints' zones. Clients choose ZONE, so they are dropped as the
	// subtree _zone.SERVICE... rather than named.
	Zonal bool
}

// service adds the names of s that its own fields answer: the Service's
// name, its port names, and the PTR names of its cluster IPs.
func (n *namer) service(b *batch, s *object.Service) {
	for _, z := range n.Zones {
		base := serviceName(s.Name, s.Namespace, z)
		b.name(base)
		for _, p := range s.Ports {
			n.port(b, p.Name, string(p.Protocol), base)
		}
		if n.Zonal && s.Headless() {
			// A ClusterIP Service's zone-scoped names are NXDOMAIN
			// whatever changes: no walk for them.
			b.subtree("_zone." + base)
		}
	}
	for _, ip := range s.ClusterIPs {
		n.ptr(b, ip)
	}
}

// serviceNames adds the names a Service's endpoints answer for under the
// Service's own name: the name and the port names of ports.
func (n *namer) serviceNames(b *batch, svc, ns string, ports []object.EndpointPort) {
	for _, z := range n.Zones {
		base := serviceName(svc, ns, z)
		b.name(base)
		for _, p := range ports {
			n.port(b, p.Name, p.Protocol, base)
		}
		if n.Zonal {
			b.subtree("_zone." + base)
		}
	}
}

// port adds _NAME._PROTO.base, the name of the SRV records of a named
// port. The plugin also matches the labels without their underscores and
// with a bare underscore for any value (parse.go, stripUnderscore); those
// spellings, which the Kubernetes DNS specification does not define, keep
// their TTL.
func (n *namer) port(b *batch, name, proto, base string) {
	if name == "" || proto == "" {
		return
	}
	b.name("_" + name + "._" + strings.ToLower(proto) + "." + base)
}

// endpoint adds the name of the endpoint at addr of Service svc in ns.
func (n *namer) endpoint(b *batch, addr object.EndpointAddress, svc, ns string) {
	h := n.hostname(addr)
	if h == "" {
		return
	}
	for _, z := range n.Zones {
		b.name(h + "." + serviceName(svc, ns, z))
	}
}

// hostname is the first label of an endpoint's name, as the plugin's
// endpointHostname makes it.
func (n *namer) hostname(addr object.EndpointAddress) string {
	switch {
	case addr.Hostname != "":
		return addr.Hostname
	case n.PodNames && addr.TargetRefName != "":
		return addr.TargetRefName
	case strings.Contains(addr.IP, "."):
		return strings.ReplaceAll(addr.IP, ".", "-")
	case strings.Contains(addr.IP, ":"):
		h := strings.ReplaceAll(addr.IP, ":", "-")
		if strings.HasSuffix(h, "-") {
			h += "0"
		}
		return h
	}
	return ""
}

// ptr adds the reverse name of ip, where it falls in one of the reverse
// zones: in-addr.arpa for IPv4, ip6.arpa for IPv6.
func (n *namer) ptr(b *batch, ip string) {
	if len(n.Reverse) == 0 {
		return
	}
	rev, err := dns.ReverseAddr(ip)
	if err != nil {
		return // "None" of a headless Service, or "" of an ExternalName one
	}
	b.nameIn(rev, n.Reverse)
}

// namespace adds the namespace's own names, which answer NODATA while it
// exists and NXDOMAIN once it does not.
func (n *namer) namespace(b *batch, ns string) {
	for _, z := range n.Zones {
		b.name(under(ns+".svc", z))
		b.name(under(ns+".pod", z))
	}
}

// pods adds the subtrees of pod names: pod.ZONE, or NS.pod.ZONE for one
// namespace's.
func (n *namer) pods(b *batch, ns string) {
	for _, z := range n.Zones {
		if ns == "" {
			b.subtree(under("pod", z))
		} else {
			b.subtree(under(ns+".pod", z))
		}
	}
}

// nameservers adds the names whose answers list the nameserver's
// addresses (the plugin's nsAddrs): each zone's apex, for its NS records
// and their glue, and ns.dns.ZONE.
func (n *namer) nameservers(b *batch) {
	for _, w := range n.Reverse {
		z, _, err := dns.UnpackDomainName(w, 0)
		if err != nil {
			continue
		}
		b.name(z)
		b.name(under("ns.dns", z))
	}
}

func serviceName(svc, ns, zone string) string { return under(svc+"."+ns+".svc", zone) }

// under is the name of the relative name rel in zone.
func under(rel, zone string) string {
	if zone == "." {
		return rel + "."
	}
	return rel + "." + zone
}

// newNamer returns the namer of a plugin serving zones: names are made
// under its non-reverse zones, and PTR names where one of its zones holds
// them, as the plugin answers PTR queries in any of its zones.
func newNamer(zones []string) namer {
	var n namer
	for _, z := range zones {
		z = strings.ToLower(dns.Fqdn(z))
		if !isReverse(z) {
			n.Zones = append(n.Zones, z)
		}
	}
	n.Reverse = dnsmsg.NewZoneSet(zones)
	return n
}

// zones adds the subtree of each of the zones the plugin answers, reverse
// ones included: all that a block's cold source drops (handoff.go).
func (n *namer) zones(b *batch) {
	for _, z := range n.Reverse {
		if b.kept(z, true) {
			b.subtrees[string(z)] = struct{}{}
		}
	}
}

// isReverse reports whether z is in in-addr.arpa or ip6.arpa, as the
// plugin's dnsutil.IsReverse does for its zones.
func isReverse(z string) bool {
	return dns.IsSubDomain("in-addr.arpa.", z) || dns.IsSubDomain("ip6.arpa.", z)
}
