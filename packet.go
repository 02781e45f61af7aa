package compactcache

import (
	"encoding/binary"
	"net/netip"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/coredns/coredns/plugin/pkg/edns"
	"github.com/miekg/dns"
)

// The front end reads requests straight from the packet: the header, the
// question and the OPT record, nothing else. A request it does not parse
// here is not wrong: it goes through the CoreDNS chain, which knows what to
// do with it.

// Offsets in the header (RFC 1035 4.1.1).
const (
	posID      = 0
	posFlags   = 2
	posQDCount = 4
	posANCount = 6
	posNSCount = 8
	posARCount = 10
)

const (
	hdrQROpcode = 1<<15 | 0xF<<11 // a response, or an opcode other than QUERY

	optDO = 1 << 15 // the DO bit in the OPT TTL's flags (RFC 3225)

	// ednsOptHeader is an option's code and length.
	ednsOptHeader = 4
	// ecsHeader is the ECS option's family, source and scope (RFC 7871 6).
	ecsHeader = 4
)

// parse fills s from the request pkt when the front end can answer it from
// the cache alone: a QUERY of one question of class IN, no other records
// than an OPT of version 0, and no EDNS option a plugin would echo. client
// is the requester, for `ecs { add }`; tcp says the reply has no size limit
// but the message's.
func (s *scratch) parse(pkt []byte, client netip.Addr, tcp bool, cfg *ecsConfig) bool {
	if len(pkt) < headerSize {
		return false
	}
	flags := binary.BigEndian.Uint16(pkt[posFlags:])
	if flags&hdrQROpcode != 0 ||
		binary.BigEndian.Uint16(pkt[posQDCount:]) != 1 ||
		binary.BigEndian.Uint16(pkt[posANCount:]) != 0 ||
		binary.BigEndian.Uint16(pkt[posNSCount:]) != 0 {
		return false
	}
	arcount := binary.BigEndian.Uint16(pkt[posARCount:])
	if arcount > 1 {
		return false // TSIG, or more than the OPT
	}
	// A question's name has nothing to point back to: RFC 1035 4.1.4
	// pointers there are left to the chain.
	off := entry.NameEnd(pkt, headerSize)
	if off < 0 {
		return false
	}
	if len(pkt) < off+4 || binary.BigEndian.Uint16(pkt[off+2:]) != dns.ClassINET {
		return false
	}
	q := &s.q
	*q = query{
		id:     binary.BigEndian.Uint16(pkt[posID:]),
		opcode: dns.OpcodeQuery,
		rd:     flags&hdrRD != 0,
		cd:     flags&hdrCD != 0,
		ad:     flags&hdrAD != 0,
		name:   s.name[:copy(s.name[:], pkt[headerSize:off])],
		qtype:  binary.BigEndian.Uint16(pkt[off:]),
		qclass: dns.ClassINET,
	}
	off += 4
	if arcount == 1 && !s.parseOPT(pkt[off:], cfg) {
		return false
	}
	if q.ecs.family == 0 && cfg.add && client.IsValid() {
		cfg.addClient(q, client)
	}
	s.finish(!tcp)
	return true
}

// ignoredOptions are the EDNS options that leave a cached reply as it is
// and that miekg/dns reads whatever their data: a request with only these
// and ECS gets the reply the chain would give it. A plugin may still echo
// one (edns.SupportedOption); the chain answers those. Others, whose data
// miekg/dns checks, are for the chain too.
var ignoredOptions = map[uint16]bool{dns.EDNS0NSID: true, dns.EDNS0COOKIE: true, dns.EDNS0PADDING: true}

// parseOPT reads the OPT record b starts with into s.q: the UDP size, the
// DO bit and the ECS option. Options other than ignoredOptions, an EDNS
// version other than 0 (BADVERS, RFC 6891 6.1.3) and anything else in the
// additional section are for the chain.
func (s *scratch) parseOPT(b []byte, cfg *ecsConfig) bool {
	// root owner (1), type (2), class = UDP size (2), TTL = extended
	// RCODE (1), version (1), flags (2), rdlength (2)
	const fixed = 11
	if len(b) < fixed || b[0] != 0 || binary.BigEndian.Uint16(b[1:]) != dns.TypeOPT || b[6] != 0 {
		return false
	}
	rdlen := int(binary.BigEndian.Uint16(b[9:]))
	if len(b) < fixed+rdlen {
		return false
	}
	q := &s.q
	q.edns = true
	q.udpSize = binary.BigEndian.Uint16(b[3:])
	q.do = binary.BigEndian.Uint16(b[7:])&optDO != 0
	for opts := b[fixed : fixed+rdlen]; len(opts) > 0; {
		if len(opts) < ednsOptHeader {
			return false
		}
		code := binary.BigEndian.Uint16(opts)
		l := int(binary.BigEndian.Uint16(opts[2:]))
		if len(opts) < ednsOptHeader+l {
			return false
		}
		data := opts[ednsOptHeader : ednsOptHeader+l]
		opts = opts[ednsOptHeader+l:]
		switch {
		case code == dns.EDNS0SUBNET:
			if q.ecs.own || !s.parseSubnet(data, cfg) {
				return false
			}
		case edns.SupportedOption(code) || !ignoredOptions[code]:
			return false
		}
	}
	return true
}

// parseSubnet reads an ECS option's data. Only the form RFC 7871 6 asks
// for is taken here, the address cut to the source prefix's bytes and a
// scope of 0; the chain judges the others as it does today.
func (s *scratch) parseSubnet(data []byte, cfg *ecsConfig) bool {
	if len(data) < ecsHeader {
		return false
	}
	family, source, scope := binary.BigEndian.Uint16(data), data[2], data[3]
	if family != familyIPv4 && family != familyIPv6 || int(source) > familyBits(family) || scope != 0 ||
		len(data) != ecsHeader+entry.PrefixBytes(int(source)) {
		return false
	}
	var addr [16]byte
	copy(addr[:], data[ecsHeader:])
	return cfg.fromSubnet(&s.q, family, source, addr)
}
