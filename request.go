package compactcache

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/coredns/coredns/plugin/pkg/edns"
	"github.com/miekg/dns"
)

// The request readers. A request reaches the cache in one of two forms: a
// *dns.Msg that CoreDNS's server unpacked and the chain passed on (readMsg),
// or a packet the front end read off its socket (readPacket). Both fill the
// same query, through the same rules for what a cached reply can answer:
//
//   - a QUERY with one question (ServeDNS and readPacket check it);
//   - a name that packs, at most 255 bytes in wire form;
//   - an ECS option in RFC 7871's form, its source prefix cut to the
//     configured one, or with `ecs { add }` the client's own subnet
//     (ecsConfig.fromSubnet, addClient);
//   - the reply's size limit and key from what was read (finish).
//
// The front end answers a packet itself only when no plugin of the chain
// could change the answer, so readPacket also leaves to the chain: classes
// other than IN, records other than one OPT of EDNS version 0 (TSIG among
// them), compressed question names, EDNS options a plugin echoes or whose
// data miekg/dns checks, and ECS options in another form than RFC 7871's.
// In plugin mode those have passed through the plugins before the cache
// already, and the server core has answered other EDNS versions (BADVERS).

// query is what a reply needs from its request. The plugin fills it from a
// *dns.Msg; a front end can fill it from the packet without unpacking one.
type query struct {
	id     uint16
	opcode int
	rd     bool
	cd     bool
	ad     bool
	name   []byte // the question's name in wire form, as the client wrote it
	qtype  uint16
	qclass uint16

	edns    bool // the request had OPT: the reply gets one
	do      bool
	udpSize uint16
	ecs     subnet
	opts    []byte // EDNS options echoed in wire form, see echoedOptions
	nsid    bool   // the request packet asks for NSID
	limit   int    // the client's size limit: 512, its UDP size, or 65535 on TCP
	rotate  bool   // records rotated as by loadbalance (replyBuffers.rotation)
}

// takes reports whether an entry found under q's key may answer q: an answer
// fetched without ECS serves no client that sent a subnet (RFC 7871 7.3.1),
// and one stored without its DNSSEC records no DO client; either's miss
// refreshes it for the clients it serves (found.upgrade).
func (q *query) takes(e entry.Entry) bool {
	return (!q.do || e.HoldsDNSSEC()) && (e.Flags()&entry.FlagNoECS == 0 || q.ecs.family == 0 || q.ecs.sent == 0)
}

const (
	optDO = 1 << 15 // the DO bit in the OPT TTL's flags (RFC 3225)

	// ednsOptHeader is an option's code and length.
	ednsOptHeader = 4
	// ecsHeader is the ECS option's family, source and scope (RFC 7871 6).
	ecsHeader = 4
)

// readPacket fills s from the request pkt when the front end can answer it from
// the cache alone: a QUERY of one question of class IN, no other records
// than an OPT of version 0, and no EDNS option a plugin would echo. client
// is the requester, for `ecs { add }`; tcp says the reply has no size limit
// but the message's.
func (s *scratch) readPacket(pkt []byte, client netip.Addr, tcp bool, cfg *ecsConfig) bool {
	if len(pkt) < dnsmsg.HeaderLen {
		return false
	}
	flags := binary.BigEndian.Uint16(pkt[dnsmsg.OffFlags:])
	if flags&dnsmsg.QROpcode != 0 ||
		binary.BigEndian.Uint16(pkt[dnsmsg.OffQDCount:]) != 1 ||
		binary.BigEndian.Uint16(pkt[dnsmsg.OffANCount:]) != 0 ||
		binary.BigEndian.Uint16(pkt[dnsmsg.OffNSCount:]) != 0 {
		return false
	}
	arcount := binary.BigEndian.Uint16(pkt[dnsmsg.OffARCount:])
	if arcount > 1 {
		return false // TSIG, or more than the OPT
	}
	// A question's name has nothing to point back to: RFC 1035 4.1.4
	// pointers there are left to the chain.
	off := dnsmsg.NameEnd(pkt, dnsmsg.HeaderLen)
	if off < 0 {
		return false
	}
	if len(pkt) < off+4 || binary.BigEndian.Uint16(pkt[off+2:]) != dns.ClassINET {
		return false
	}
	q := &s.q
	*q = query{
		id:     binary.BigEndian.Uint16(pkt[dnsmsg.OffID:]),
		opcode: dns.OpcodeQuery,
		rd:     flags&dnsmsg.RD != 0,
		cd:     flags&dnsmsg.CD != 0,
		ad:     flags&dnsmsg.AD != 0,
		name:   s.name[:copy(s.name[:], pkt[dnsmsg.HeaderLen:off])],
		qtype:  binary.BigEndian.Uint16(pkt[off:]),
		qclass: dns.ClassINET,
	}
	off += 4
	if arcount == 1 && !s.readOPT(pkt[off:], cfg) {
		return false
	}
	if q.ecs.family == 0 && cfg.Add && client.IsValid() {
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

// readOPT reads the OPT record b starts with into s.q: the UDP size, the
// DO bit and the ECS option. Options other than ignoredOptions, an EDNS
// version other than 0 (BADVERS, RFC 6891 6.1.3) and anything else in the
// additional section are for the chain.
func (s *scratch) readOPT(b []byte, cfg *ecsConfig) bool {
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
			if q.ecs.own || !s.readSubnet(data, cfg) {
				return false
			}
		case edns.SupportedOption(code) || !ignoredOptions[code]:
			return false
		}
		q.nsid = q.nsid || code == dns.EDNS0NSID
	}
	return true
}

// readSubnet reads an ECS option's data. Only the form RFC 7871 6 asks
// for is taken here, the address cut to the source prefix's bytes and a
// scope of 0; the chain judges the others as it does today.
func (s *scratch) readSubnet(data []byte, cfg *ecsConfig) bool {
	if len(data) < ecsHeader {
		return false
	}
	family, source, scope := binary.BigEndian.Uint16(data), data[2], data[3]
	if family != dnsmsg.FamilyIPv4 && family != dnsmsg.FamilyIPv6 || int(source) > familyBits(family) || scope != 0 ||
		len(data) != ecsHeader+dnsmsg.PrefixBytes(int(source)) {
		return false
	}
	var addr [16]byte
	copy(addr[:], data[ecsHeader:])
	return cfg.fromSubnet(&s.q, family, source, addr)
}

// readMsg fills s from r; false when the question's name does not pack (s.key
// is then empty) or its ECS option is malformed.
func (s *scratch) readMsg(r *dns.Msg, w dns.ResponseWriter, ecs *ecsConfig) bool {
	q := &s.q
	question := r.Question[0]
	n, err := dnsmsg.PackName(question.Name, s.name[:])
	if err != nil {
		s.key = s.key[:0]
		return false
	}
	*q = query{
		id:     r.Id,
		opcode: r.Opcode,
		rd:     r.RecursionDesired,
		cd:     r.CheckingDisabled,
		ad:     r.AuthenticatedData,
		name:   s.name[:n],
		qtype:  question.Qtype,
		qclass: question.Qclass,
	}
	o := r.IsEdns0()
	if o != nil {
		q.edns, q.do, q.udpSize = true, o.Do(), o.UDPSize()
		s.opts = appendEchoed(s.opts[:0], o)
		q.opts = s.opts
	}
	_, udp := w.RemoteAddr().(*net.UDPAddr)
	s.finish(udp)
	return ecs.loadSubnet(q, o, w)
}

// finish sets the size limit of the reply to s.q and its key. The limits
// are those of CoreDNS's request.Size: UDP clients get their EDNS size, at
// least 512; everything else gets a whole message.
func (s *scratch) finish(udp bool) {
	q := &s.q
	q.limit = dns.MaxMsgSize
	if udp {
		q.limit = dns.MinMsgSize
		if q.edns {
			q.limit = max(q.limit, int(q.udpSize))
		}
	}
	s.key = entry.AppendKey(s.key[:0], q.name, q.qtype, q.qclass, q.cd)
}
