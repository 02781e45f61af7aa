package compactcache

import (
	"encoding/binary"
	"errors"

	"github.com/miekg/dns"
)

// builder packs a response into an entry in reused scratch buffers, so that
// storing it costs one copy into the arena and no allocation.
type builder struct {
	buf  []byte    // the entry being built
	wire []byte    // a record in wire form, uncompressed (packRR)
	one  [1]dns.RR // the message of one record that packOther packs
	key  []byte    // a derived key

	meta    []byte // a list of ECS variants being built
	dropped []byte // the key of a variant dropped from the list
}

func newBuilder() *builder {
	return &builder{
		buf:  make([]byte, 0, typicalMsgLen),
		wire: make([]byte, typicalMsgLen),
		key:  make([]byte, 0, maxKeyLen),

		meta:    make([]byte, 0, 4096),
		dropped: make([]byte, 0, maxKeyLen),
	}
}

// otherKey returns key with keyOther set, in b's key buffer.
func (b *builder) otherKey(key []byte) []byte {
	b.key = withFlagsTo(b.key[:0], key, keyOther)
	return b.key
}

// build packs the records of m behind the header and key, for an entry of
// TTL ttl whose records are kept with TTLs of at least floor (MINTTL, as the
// stock cache serves them: a record served with TTL 0 while the entry lives
// would defeat every cache behind this one); limit bounds the bytes of the
// records. key starts with the lowercased wire qname and the
// keyTail bytes, as appendKey makes it. Each record is packed on its own
// (packRR), so that m's header and question are not packed at all; build
// still fails wherever Msg.PackBuffer would, and its other errors come in
// record order after those. asked is the request's question name, which
// packed to key's name ignoring case, or "": a reply that echoes it, as
// replies do, has its question checked without packing it again.
func (b *builder) build(m *dns.Msg, key []byte, asked string, stored, ttl, floor uint32, flags uint16, limit int) (entry, error) {
	nameLen := wireNameLen(key)
	qname := key[:nameLen]
	alias, err := b.checkPackable(m, qname, asked)
	if err != nil {
		return nil, err
	}
	// Built in a local slice, stored back once: an append stored in the
	// builder, on the heap, pays a write barrier while the garbage collector
	// marks, and an entry takes a few for each record.
	buf := b.buf[:headerLen]
	binary.LittleEndian.PutUint32(buf[offStored:], stored)
	binary.LittleEndian.PutUint32(buf[offTTL:], ttl)
	binary.LittleEndian.PutUint32(buf[offLastHit:], 0) // last hit and hits
	buf[offNameLen] = byte(nameLen)
	buf = append(buf, key...)
	start := len(buf)

	qtype := binary.BigEndian.Uint16(key[nameLen:])
	qclass := binary.BigEndian.Uint16(key[nameLen+2:])
	var refused error // the first record the entry cannot take
	for s, rrs := range [3][]dns.RR{m.Answer, m.Ns, m.Extra} {
		kept := 0
		for _, rr := range rrs {
			var r record
			err := b.packRR(rr, alias, &r) // hop-by-hop records too: PackBuffer packed them
			switch {
			case err != nil:
				return nil, err
			case refused != nil || hopByHop(r.rtype):
				continue
			case !rdataNamesWhole(r.rtype, r.rdata):
				refused = errBadRdata
				continue
			}
			r.ttl = max(wireTTL(r.ttl), floor)
			if r.ttl < ttl && dnssecOnly(r.rtype, s) && !askedFor(r.rtype, s, qtype) {
				flags |= flagShortProof
			}
			buf = appendRecord(buf, &r, s, qname, qtype, qclass, ttl)
			if len(buf)-start > limit {
				refused = errEntryTooLarge
			}
			kept++
		}
		binary.LittleEndian.PutUint16(buf[offCounts+2*s:], uint16(kept))
	}
	binary.LittleEndian.PutUint16(buf[offFlags:], flags) // with flagShortProof, known now
	b.buf = buf
	if refused != nil {
		return nil, refused
	}
	binary.LittleEndian.PutUint32(buf[offSize:], uint32(len(buf)))
	return entry(buf), nil
}

// checkPackable returns the error Msg.PackBuffer would return for the parts
// of m that build does not pack: the RCODE, and the question's names. It
// also returns the question's name when its wire form is qname, ignoring
// case, for packRR to recognize the owners that are the qname; asked is as
// for build.
func (b *builder) checkPackable(m *dns.Msg, qname []byte, asked string) (alias string, err error) {
	switch {
	case m.Rcode < 0 || m.Rcode > 0xFFF:
		return "", dns.ErrRcode
	case m.Rcode > 0xF && m.IsEdns0() == nil:
		return "", dns.ErrExtendedRcode // the upper bits go in OPT
	}
	for i, q := range m.Question {
		if i == 0 && q.Name == asked && asked != "" {
			alias = q.Name // it packs, to qname ignoring case
			continue
		}
		if b.wire, err = appendName(b.wire[:0], q.Name); err != nil {
			return "", err
		}
		if i == 0 && equalFoldWire(b.wire, qname) {
			alias = q.Name
		}
	}
	return alias, nil
}

// wireRecord parses the uncompressed resource record at off in a message
// miekg/dns packed, and returns it with the offset of the next.
func wireRecord(wire []byte, off int) (record, int) {
	nl := wireNameLen(wire[off:])
	r := record{owner: wire[off : off+nl]}
	off += nl
	r.rtype = binary.BigEndian.Uint16(wire[off:])
	r.class = binary.BigEndian.Uint16(wire[off+2:])
	r.ttl = binary.BigEndian.Uint32(wire[off+4:])
	rdlen := int(binary.BigEndian.Uint16(wire[off+8:]))
	off += 10
	r.rdata = wire[off : off+rdlen]
	return r, off + rdlen
}

// hopByHop reports the types that belong to one transaction and are never
// cached: OPT (RFC 6891) and TSIG (RFC 8945).
func hopByHop(t uint16) bool { return t == dns.TypeOPT || t == dns.TypeTSIG }

// dnssecOnly reports the records of section that only DO clients get:
// RRSIG, NSEC and NSEC3 (RFC 4035 3.2.1), and DS in referrals (3.1.4).
func dnssecOnly(t uint16, section int) bool {
	return t == dns.TypeRRSIG || t == dns.TypeNSEC || t == dns.TypeNSEC3 || t == dns.TypeDS && section != 0
}

// askedFor reports the exception to dnssecOnly: a client that asks for the
// type explicitly gets it in the answer section, DO or not.
func askedFor(t uint16, section int, qtype uint16) bool { return section == 0 && t == qtype }

// errBadRdata refuses records the reply writer could not write back.
var errBadRdata = errors.New("rdata without the domain names its type has")

// rdataNamesWhole reports whether the rdata of the types whose names the
// reply writer compresses holds whole names where they belong: miekg/dns
// accepts such records with RDLENGTH 0 from the wire.
func rdataNamesWhole(t uint16, rd []byte) bool {
	switch t {
	case dns.TypeCNAME, dns.TypeNS, dns.TypePTR:
		return nameEnd(rd, 0) == len(rd)
	case dns.TypeMX:
		return len(rd) > 2 && nameEnd(rd, 2) == len(rd)
	case dns.TypeSOA:
		mname := nameEnd(rd, 0)
		return mname > 0 && nameEnd(rd, mname)+20 == len(rd)
	}
	return true
}

// nameEnd returns the offset past the uncompressed wire name at off in b, or
// -1 when b does not hold one there.
func nameEnd(b []byte, off int) int {
	for off < len(b) {
		l := int(b[off])
		switch {
		case l == 0:
			return off + 1
		case l > 63:
			return -1
		}
		off += l + 1
	}
	return -1
}

// appendRecord lays r out in the record format of entry.go, for an entry of
// TTL ttl. An owner of nil is the qname, as in entry.record.
func appendRecord(buf []byte, r *record, section int, qname []byte, qtype, qclass uint16, ttl uint32) []byte {
	var flags byte
	if r.owner == nil || equalFoldWire(r.owner, qname) {
		flags |= recOwnerIsQname
	}
	if r.rtype == qtype {
		flags |= recTypeIsQtype
	}
	if r.class == qclass {
		flags |= recClassIsQclass
	}
	if dnssecOnly(r.rtype, section) {
		flags |= recDNSSEC
	}
	if wireTTL(r.ttl) >= ttl {
		flags |= recTTLIsEntry
	}
	buf = append(buf, flags)
	if flags&recOwnerIsQname == 0 {
		buf = append(buf, r.owner...)
	}
	if flags&recTypeIsQtype == 0 {
		buf = binary.BigEndian.AppendUint16(buf, r.rtype)
	}
	if flags&recClassIsQclass == 0 {
		buf = binary.BigEndian.AppendUint16(buf, r.class)
	}
	if flags&recTTLIsEntry == 0 {
		buf = binary.BigEndian.AppendUint32(buf, wireTTL(r.ttl))
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(r.rdata)))
	return append(buf, r.rdata...)
}
