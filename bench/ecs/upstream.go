package main

import (
	"context"
	"errors"
	"net"
	"net/netip"

	"github.com/compactcache/compactcache/bench"
	"github.com/compactcache/compactcache/internal/workload"

	"github.com/miekg/dns"
)

// geoUpstream answers like an authoritative GeoDNS server behind the cache.
// bench.Upstream answers the ecs variant with workload.Reply, whose ECS
// option is that of client workload.Client(i) and whose records are the same
// for every subnet: a cache asking entry i for another subnet would get an
// echo that does not match its query (a forgery to compactcache), and a
// wrong-subnet answer could not be told from a right one. geoUpstream wraps
// bench.Upstream (so the reply is still packed and unpacked as forward
// delivers it) and rewrites the reply on its way to the cache:
//
//   - its ECS option echoes the query's FAMILY, SOURCE PREFIX-LENGTH and
//     ADDRESS, with SCOPE PREFIX-LENGTH from scope (by default /24 for IPv4,
//     /56 for IPv6, as WORKLOAD.md says);
//   - its records are tailored to the subnet: the last two bytes of every A
//     and AAAA address, or the first two characters of every TXT string, hold
//     a tag of the query's subnet (the client index j of workload.Subnet(j)),
//     so that the records keep their sizes and a reply tells which subnet it
//     was made for.
type geoUpstream struct {
	up    *bench.Upstream
	scope func(family uint16, addr netip.Addr) uint8
}

func newGeoUpstream() *geoUpstream {
	return &geoUpstream{up: &bench.Upstream{Variant: workload.ECS}, scope: geoScope}
}

// geoScope is the workload's scope: /24 for IPv4, /56 for IPv6.
func geoScope(family uint16, _ netip.Addr) uint8 {
	if family == 1 {
		return 24
	}
	return 56
}

// Name implements plugin.Handler.
func (g *geoUpstream) Name() string { return "geo-upstream" }

// Calls returns the number of queries answered.
func (g *geoUpstream) Calls() int64 { return g.up.Calls() }

var errNoECS = errors.New("geo upstream: query without ECS")

// ServeDNS implements plugin.Handler.
func (g *geoUpstream) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	q := subnetOf(r)
	if q == nil {
		return dns.RcodeServerFailure, errNoECS
	}
	return g.up.ServeDNS(ctx, &tailor{ResponseWriter: w, q: q, g: g}, r)
}

// tailor rewrites the upstream's reply for the query's subnet q.
type tailor struct {
	dns.ResponseWriter
	q *dns.EDNS0_SUBNET
	g *geoUpstream
}

func (t *tailor) WriteMsg(m *dns.Msg) error {
	addr := addrOf(t.q)
	echo := &dns.EDNS0_SUBNET{
		Code:          dns.EDNS0SUBNET,
		Family:        t.q.Family,
		SourceNetmask: t.q.SourceNetmask,
		SourceScope:   t.g.scope(t.q.Family, addr),
		Address:       append(net.IP(nil), t.q.Address...),
	}
	o := m.IsEdns0()
	if o == nil {
		return errors.New("geo upstream: reply without OPT")
	}
	opts := o.Option[:0]
	for _, e := range o.Option {
		if _, ok := e.(*dns.EDNS0_SUBNET); !ok {
			opts = append(opts, e)
		}
	}
	o.Option = append(opts, echo)
	tag := tagOf(addr)
	for _, rr := range m.Answer {
		setTag(rr, tag)
	}
	return t.ResponseWriter.WriteMsg(m)
}

// subnetOf returns the ECS option of m, or nil.
func subnetOf(m *dns.Msg) *dns.EDNS0_SUBNET {
	if o := m.IsEdns0(); o != nil {
		for _, e := range o.Option {
			if s, ok := e.(*dns.EDNS0_SUBNET); ok {
				return s
			}
		}
	}
	return nil
}

func addrOf(e *dns.EDNS0_SUBNET) netip.Addr {
	if e.Family == 1 {
		if a, ok := netip.AddrFromSlice(e.Address.To4()); ok {
			return a
		}
		return netip.Addr{}
	}
	a, _ := netip.AddrFromSlice(e.Address.To16())
	return a
}

// tagOf returns the index j of the workload subnet addr is in: IPv4
// 100.(64+k>>8).(k&255).0/24 is client 2k, IPv6 2001:db8:0:kk::/56 is 2k+1.
// Other addresses get a tag from the same bytes, which no check relies on.
func tagOf(a netip.Addr) int {
	if a.Is4() {
		b := a.As4()
		return 2 * (int(b[1]-64)<<8 | int(b[2]))
	}
	b := a.As16()
	return 2*(int(b[5])<<8|int(b[6])) + 1
}

const base36 = "abcdefghijklmnopqrstuvwxyz0123456789" // the workload's TXT alphabet

func setTag(rr dns.RR, tag int) {
	switch rr := rr.(type) {
	case *dns.A:
		ip := rr.A.To4()
		ip[2], ip[3] = byte(tag>>8), byte(tag)
		rr.A = ip
	case *dns.AAAA:
		rr.AAAA[14], rr.AAAA[15] = byte(tag>>8), byte(tag)
	case *dns.TXT:
		s := rr.Txt[0]
		rr.Txt[0] = string([]byte{base36[tag/36%36], base36[tag%36]}) + s[2:]
	}
}

// replyTag returns the subnet tag of a reply's first record of type qtype,
// or -1 when it has none.
func replyTag(m *dns.Msg, qtype uint16) int {
	for _, rr := range m.Answer {
		if rr.Header().Rrtype != qtype {
			continue
		}
		switch rr := rr.(type) {
		case *dns.A:
			ip := rr.A.To4()
			return int(ip[2])<<8 | int(ip[3])
		case *dns.AAAA:
			return int(rr.AAAA[14])<<8 | int(rr.AAAA[15])
		case *dns.TXT:
			s := rr.Txt[0]
			return index36(s[0])*36 + index36(s[1])
		}
	}
	return -1
}

func index36(c byte) int {
	for i := range len(base36) {
		if base36[i] == c {
			return i
		}
	}
	return -1
}

// setPrefix makes request m, built by workload.NewRequest with the ecs
// variant, carry prefix p as its client subnet (scope 0), allocating nothing.
func setPrefix(m *dns.Msg, p netip.Prefix) {
	workload.SetPrefix(m.Extra[0].(*dns.OPT).Option[0].(*dns.EDNS0_SUBNET), p)
}
