package compactcache

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/miekg/dns"
)

// EDNS Client Subnet (RFC 7871). An answer tailored to a client subnet is
// stored under the key of its question followed by the family, the stored
// prefix length L and the client's address masked to L, where L is the
// smallest of the source prefix sent upstream and the scope the upstream
// answered with. A lookup walks the prefix lengths stored for the name, from
// the client's source prefix down, and ends with the entry that serves
// everyone. An answer with scope 0 is good for every address of its family
// (7.2.2), the variant of length 0. Which lengths are stored is kept per name and family in a
// bookkeeping entry (keyScopes): a bitmap of the lengths, and the variants in
// the order they came, so that the oldest goes first past max_variants.

// ecsConfig is the `ecs` option, which the request readers apply.
type ecsConfig struct{ config.ECS }

// subnet is the ECS of one request (RFC 7871 6).
type subnet struct {
	family uint16   // 0 when the request goes upstream without ECS
	source uint8    // the client's SOURCE PREFIX-LENGTH, echoed back to it
	sent   uint8    // the source prefix sent upstream: at most the configured one
	addr   [16]byte // masked to sent
	echo   [16]byte // masked to source
	own    bool     // the client sent it; an ECS the cache added is not echoed
}

func familyBits(family uint16) int {
	if family == dnsmsg.FamilyIPv4 {
		return 32
	}
	return 128
}

// loadSubnet fills q.ecs from the request's ECS option, or from the
// client's address when configured to add one. It reports false for an
// option RFC 7871 6 calls malformed: an unknown family, a source prefix
// longer than the family's addresses, or address bits past the prefix.
func (cfg *ecsConfig) loadSubnet(q *query, o *dns.OPT, w dns.ResponseWriter) bool {
	q.ecs = subnet{}
	if o != nil {
		for _, opt := range o.Option {
			if e, ok := opt.(*dns.EDNS0_SUBNET); ok {
				return cfg.fromOption(q, e)
			}
		}
	}
	if cfg.Add {
		cfg.addClient(q, dnsmsg.RemoteIP(w))
	}
	return true
}

// addClient fills q.ecs with the client's subnet, as long as the source
// prefix configured for its family.
func (cfg *ecsConfig) addClient(q *query, ip netip.Addr) {
	if !ip.IsValid() {
		return
	}
	ip = ip.Unmap()
	s := &q.ecs
	if ip.Is4() {
		s.family = dnsmsg.FamilyIPv4
		a := ip.As4()
		copy(s.addr[:], a[:])
	} else {
		s.family = dnsmsg.FamilyIPv6
		s.addr = ip.As16()
	}
	s.sent = uint8(cfg.maxSource(s.family))
	s.source = s.sent
	s.addr = dnsmsg.Mask(s.addr, int(s.sent))
}

func (cfg *ecsConfig) maxSource(family uint16) int {
	if family == dnsmsg.FamilyIPv4 {
		return cfg.Source4
	}
	return cfg.Source6
}

func (cfg *ecsConfig) fromOption(q *query, e *dns.EDNS0_SUBNET) bool {
	var addr [16]byte
	if e.Family == dnsmsg.FamilyIPv4 {
		ip4 := e.Address.To4()
		if ip4 == nil && e.Address != nil {
			return false
		}
		copy(addr[:], ip4)
	} else {
		copy(addr[:], e.Address.To16())
	}
	return cfg.fromSubnet(q, e.Family, e.SourceNetmask, addr)
}

// fromSubnet fills q.ecs from the client's ECS option: family, source
// prefix and the address, in the first bytes of addr.
func (cfg *ecsConfig) fromSubnet(q *query, family uint16, source uint8, addr [16]byte) bool {
	if family != dnsmsg.FamilyIPv4 && family != dnsmsg.FamilyIPv6 || int(source) > familyBits(family) {
		return false
	}
	if dnsmsg.Mask(addr, int(source)) != addr {
		return false
	}
	s := subnet{family: family, source: source, addr: addr, echo: addr, own: true}
	s.sent = uint8(min(int(s.source), cfg.maxSource(s.family)))
	s.addr = dnsmsg.Mask(s.addr, int(s.sent))
	q.ecs = s
	return true
}

// option returns the ECS option for a request carrying s with prefix bits.
func (s *subnet) option(prefix uint8) *dns.EDNS0_SUBNET {
	n := 4
	if s.family == dnsmsg.FamilyIPv6 {
		n = 16
	}
	addr := dnsmsg.Mask(s.addr, int(prefix))
	return &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: s.family, SourceNetmask: prefix, Address: net.IP(addr[:n])}
}

// appendSubnet writes the ECS option echoed to a client that sent s: its
// family, source prefix and address, and the scope the answer was stored
// for (RFC 7871 7.2.2), longer than the source for one whose upstream
// wanted more bits than the client sent.
func appendSubnet(b []byte, s *subnet, scope uint8) []byte {
	n := dnsmsg.PrefixBytes(int(s.source))
	b = binary.BigEndian.AppendUint16(b, dns.EDNS0SUBNET)
	b = binary.BigEndian.AppendUint16(b, uint16(4+n))
	b = binary.BigEndian.AppendUint16(b, s.family)
	b = append(b, s.source, scope)
	return append(b, s.echo[:n]...)
}
