package workload

import (
	"net"
	"net/netip"

	"github.com/miekg/dns"
)

// Clients is the number of client subnets of the ecs variant.
const Clients = 1000

// Client returns the client that asks for entry i in the ecs variant: the
// clients take the entries in turn.
func Client(i int) int { return i % Clients }

// Subnet returns client j's subnet, as its resolver sends it in ECS and as
// the upstream scopes the answer: even clients are IPv4 /24s in 100.64.0.0/15,
// odd ones IPv6 /56s in 2001:db8::/40.
func Subnet(j int) netip.Prefix {
	k := j / 2
	if j%2 == 0 {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64 + byte(k>>8), byte(k), 0}), 24)
	}
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, byte(k >> 8), byte(k)}), 56)
}

// newOPT returns the OPT record requests and replies of variant v carry.
func newOPT(v Variant) *dns.OPT {
	o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: UDPSize}}
	o.SetDo(v&DNSSEC != 0)
	if v&ECS != 0 {
		// A 16-byte address holds either family, so that SetRequest
		// rewrites it in place.
		o.Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Address: make(net.IP, net.IPv6len)}}
	}
	return o
}

// setSubnet makes e carry client j's subnet as its source, scope 0.
func setSubnet(e *dns.EDNS0_SUBNET, j int) { SetPrefix(e, Subnet(j)) }

// SetPrefix makes e carry prefix p as its source, scope 0. It allocates
// nothing when e's address has room for both families, as the options of
// NewRequest and Reply do.
func SetPrefix(e *dns.EDNS0_SUBNET, p netip.Prefix) {
	a := p.Addr().As16() // IPv4 comes out IPv4-mapped, which To4 accepts
	copy(e.Address, a[:])
	e.Family = 2
	if p.Addr().Is4() {
		e.Family = 1
	}
	e.SourceNetmask = uint8(p.Bits())
	e.SourceScope = 0
}

// NewRequest returns the query for entry i as a stub resolver sends it:
// recursion desired, EDNS with a UDPSize buffer, DO in the dnssec variant,
// the client's subnet in the ecs variant.
func NewRequest(i int, v Variant) *dns.Msg {
	m := new(dns.Msg)
	m.Question = make([]dns.Question, 1)
	m.Extra = []dns.RR{newOPT(v)}
	SetRequest(m, i, v, Name(i))
	return m
}

// SetRequest turns m, made by NewRequest with the same variant, into the
// query for entry i, whose qname is name (Name(i), or Names.Name(i) to avoid
// allocating). It resets every field a cache might have changed and allocates
// nothing, so one request serves a whole benchmark.
func SetRequest(m *dns.Msg, i int, v Variant, name string) {
	m.MsgHdr = dns.MsgHdr{Id: uint16(i), Opcode: dns.OpcodeQuery, RecursionDesired: true}
	m.Compress = false
	m.Question[0] = dns.Question{Name: name, Qtype: Qtype(i), Qclass: dns.ClassINET}
	m.Answer, m.Ns, m.Extra = m.Answer[:0], m.Ns[:0], m.Extra[:1]
	o := m.Extra[0].(*dns.OPT)
	o.Hdr = dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: UDPSize}
	o.SetDo(v&DNSSEC != 0)
	if v&ECS != 0 {
		setSubnet(o.Option[0].(*dns.EDNS0_SUBNET), Client(i))
	}
}
