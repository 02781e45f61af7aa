package entry

import (
	"encoding/binary"
	"errors"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/miekg/dns"
)

// Builder packs a response into an entry in reused scratch buffers, so that
// storing it costs one copy into the arena and no allocation.
type Builder struct {
	buf  []byte    // the entry being built
	wire []byte    // a record in wire form, uncompressed (packRR)
	one  [1]dns.RR // the message of one record that packOther packs
	Key  []byte    // a derived key

	meta    []byte // a list of ECS variants being built
	dropped []byte // the key of a variant dropped from the list
}

// typicalLen is the size a builder's buffers start at: that of the EDNS
// buffers of DNS flag day 2020. They grow with the rare larger reply.
const typicalLen = 1232

func NewBuilder() *Builder {
	return &Builder{
		buf:  make([]byte, 0, typicalLen),
		wire: make([]byte, typicalLen),
		Key:  make([]byte, 0, MaxKeyLen),

		meta:    make([]byte, 0, 4096),
		dropped: make([]byte, 0, MaxKeyLen),
	}
}

// OtherKey returns key with keyOther set, in b's key buffer.
func (b *Builder) OtherKey(key []byte) []byte {
	b.Key = withFlagsTo(b.Key[:0], key, KeyOther)
	return b.Key
}

// Build packs the records of m behind the header and key, for an entry of
// TTL ttl whose records are kept with TTLs of at least floor (MINTTL, as the
// stock cache serves them: a record served with TTL 0 while the entry lives
// would defeat every cache behind this one); limit bounds the bytes of the
// records. key is the entry's key as AppendKey and the variant keys make
// it: the lowercased wire qname, the qtype and flags, the class when not IN,
// any ECS suffix. Each record is packed on its own
// (packRR), so that m's header and question are not packed at all; build
// still fails wherever Msg.PackBuffer would, and its other errors come in
// record order after those. asked is the request's question name, which
// packed to key's name ignoring case, or "": a reply that echoes it, as
// replies do, has its question checked without packing it again.
//
// With FlagDNSSEC in flags the entry keeps every record. Without it, the
// records only DO clients get (DNSSECOnly, unless asked for) are left out,
// bytes that clients without DO never receive, and the entry gets
// FlagDNSSEC all the same when m had none: it then holds all there is.
func (b *Builder) Build(m *dns.Msg, key []byte, asked string, stored, ttl, floor uint32, flags uint16, limit int) (Entry, error) {
	nameLen := dnsmsg.WireNameLen(key)
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
	body := len(buf)
	buf = append(buf, make([]byte, countsLen)...)
	start := len(buf)

	qtype := binary.BigEndian.Uint16(key[nameLen:])
	qclass := keyClass(key, nameLen)
	var refused error // the first record the entry cannot take
	keepDNSSEC, left, plain := flags&FlagDNSSEC != 0, false, true
	for s, rrs := range [3][]dns.RR{m.Answer, m.Ns, m.Extra} {
		kept := 0
		for _, rr := range rrs {
			var r Record
			err := b.packRR(rr, alias, &r) // hop-by-hop records too: PackBuffer packed them
			switch {
			case err != nil:
				return nil, err
			case refused != nil || HopByHop(r.Type):
				continue
			case !rdataWhole(r.Type, r.Rdata):
				refused = errBadRdata
				continue
			case len(r.Owner) > dnsmsg.MaxNameLen:
				refused = dns.ErrLongDomain // miekg/dns packs it, but no reader takes it, Check included
				continue
			}
			proof := DNSSECOnly(r.Type, s) && !AskedFor(r.Type, s, qtype)
			if proof && !keepDNSSEC {
				left = true
				continue
			}
			r.TTL = max(dnsmsg.WireTTL(r.TTL), floor)
			if sig, ok := rr.(*dns.RRSIG); ok && stored != 0 {
				// Not past its signature's expiration, as a validator caps
				// it (RFC 4035 5.3.3): a DO client would get it expired,
				// where it should miss and fetch the zone's new one. One
				// asked for (RRSIG, ANY) bounds the entry's TTL (reply.Read).
				// An entry stored at 0 is a reply passed on, not stored:
				// its records keep the upstream's TTLs.
				r.TTL = min(r.TTL, ValidFor(sig, stored))
			}
			if proof && r.TTL < ttl {
				flags |= FlagShortProof
			}
			rf := recordFlags(&r, s, qname, qtype, qclass, ttl)
			plain = plain && s == 0 && rf == plainFlags && fitsPlain(qtype, r.Rdata)
			buf = layRecord(buf, &r, rf)
			if len(buf)-start > limit {
				refused = ErrTooLarge
			}
			kept++
		}
		binary.LittleEndian.PutUint16(buf[body+2*s:], uint16(kept))
	}
	if !left {
		flags |= FlagDNSSEC
	}
	if plain {
		buf = toPlain(buf, body, qtype)
		flags |= flagPlain
	}
	binary.LittleEndian.PutUint16(buf[offFlags:], flags) // with FlagShortProof and FlagDNSSEC, known now
	b.buf = buf
	if refused != nil {
		return nil, refused
	}
	putSize(buf)
	return Entry(buf), nil
}

// ValidFor returns the seconds from now, a unix second, to sig's expiration,
// 0 once it has passed. The expiration is a serial number (RFC 4034 3.1.5):
// the signed difference modulo 2^32 (RFC 1982) is the nearer of its times.
func ValidFor(sig *dns.RRSIG, now uint32) uint32 {
	return uint32(max(int32(sig.Expiration-now), 0))
}

// fitsPlain reports whether a plain record of type t may hold rd: one of a
// type of fixed rdata length must have that length.
func fitsPlain(t uint16, rd []byte) bool {
	n := fixedRdlen(t)
	return n == 0 || len(rd) == n
}

// toPlain rewrites the body at body of the entry buf, counts and records of
// the record format whose every record is plain, as plain records, and
// returns the shorter entry. Each plain record is shorter than the record it
// is made from, so the rewrite runs in place, front to back.
func toPlain(buf []byte, body int, qtype uint16) []byte {
	fixed := fixedRdlen(qtype) > 0
	w := body
	for r := body + countsLen; r < len(buf); {
		r++ // the record's flags: plainFlags
		n := int(binary.BigEndian.Uint16(buf[r:]))
		if fixed {
			r += 2
		} else {
			n += 2 // the rdata's length, kept
		}
		w += copy(buf[w:], buf[r:r+n])
		r += n
	}
	return buf[:w]
}

// checkPackable returns the error Msg.PackBuffer would return for the parts
// of m that build does not pack: the RCODE, and the question's names. It
// also returns the question's name when its wire form is qname, ignoring
// case, for packRR to recognize the owners that are the qname; asked is as
// for build.
func (b *Builder) checkPackable(m *dns.Msg, qname []byte, asked string) (alias string, err error) {
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
		if b.wire, err = appendTextName(b.wire[:0], q.Name); err != nil {
			return "", err
		}
		if i == 0 && dnsmsg.EqualFoldWire(b.wire, qname) {
			alias = q.Name
		}
	}
	return alias, nil
}

// WireRecord parses the uncompressed resource record at off in a message
// miekg/dns packed, and returns it with the offset of the next.
func WireRecord(wire []byte, off int) (Record, int) {
	nl := dnsmsg.WireNameLen(wire[off:])
	r := Record{Owner: wire[off : off+nl]}
	off += nl
	r.Type = binary.BigEndian.Uint16(wire[off:])
	r.Class = binary.BigEndian.Uint16(wire[off+2:])
	r.TTL = binary.BigEndian.Uint32(wire[off+4:])
	rdlen := int(binary.BigEndian.Uint16(wire[off+8:]))
	off += 10
	r.Rdata = wire[off : off+rdlen]
	return r, off + rdlen
}

// HopByHop reports the types that belong to one transaction and are never
// cached: OPT (RFC 6891) and TSIG (RFC 8945).
func HopByHop(t uint16) bool { return t == dns.TypeOPT || t == dns.TypeTSIG }

// DNSSECOnly reports the records of section that only DO clients get:
// RRSIG, NSEC and NSEC3 (RFC 4035 3.2.1), and DS in referrals (3.1.4).
func DNSSECOnly(t uint16, section int) bool {
	return t == dns.TypeRRSIG || t == dns.TypeNSEC || t == dns.TypeNSEC3 || t == dns.TypeDS && section != 0
}

// AskedFor reports the exception to dnssecOnly: a client that asks for the
// type explicitly, or for ANY, gets it in the answer section, DO or not (RFC
// 3225 3), as Unbound answers ANY.
func AskedFor(t uint16, section int, qtype uint16) bool {
	return section == 0 && (t == qtype || qtype == dns.TypeANY)
}

// errBadRdata refuses records the reply writer could not write back, or
// would write back as no client reads them.
var errBadRdata = errors.New("rdata not of its type's length, or without the domain names its type has")

// rdataWhole reports whether rd is rdata of type t's length (rdataLen,
// an address's empty too) and, for the types whose names the reply writer
// compresses, holds whole names where they belong (dnsmsg.RdataNames).
func rdataWhole(t uint16, rd []byte) bool {
	if n := rdataLen(t); n > 0 && len(rd) != n && (len(rd) > 0 || fixedRdlen(t) == 0) {
		return false
	}
	_, _, _, ok := dnsmsg.RdataNames(t, rd)
	return ok
}

// recordFlags returns the flags of r in the record format of entry.go, for
// an entry of TTL ttl. An owner of nil is the qname, as in entry.record.
func recordFlags(r *Record, section int, qname []byte, qtype, qclass uint16, ttl uint32) byte {
	var flags byte
	if r.Owner == nil || dnsmsg.EqualFoldWire(r.Owner, qname) {
		flags |= RecOwnerIsQname
	}
	if r.Type == qtype {
		flags |= recTypeIsQtype
	}
	if r.Class == qclass {
		flags |= recClassIsQclass
	}
	if DNSSECOnly(r.Type, section) {
		flags |= RecDNSSEC
	}
	if dnsmsg.WireTTL(r.TTL) >= ttl {
		flags |= RecTTLIsEntry
	}
	return flags
}

// layRecord appends r in the record format of entry.go, with flags as
// recordFlags gives them.
func layRecord(buf []byte, r *Record, flags byte) []byte {
	buf = append(buf, flags)
	if flags&RecOwnerIsQname == 0 {
		buf = append(buf, r.Owner...)
	}
	if flags&recTypeIsQtype == 0 {
		buf = binary.BigEndian.AppendUint16(buf, r.Type)
	}
	if flags&recClassIsQclass == 0 {
		buf = binary.BigEndian.AppendUint16(buf, r.Class)
	}
	if flags&RecTTLIsEntry == 0 {
		buf = binary.BigEndian.AppendUint32(buf, dnsmsg.WireTTL(r.TTL))
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(r.Rdata)))
	return append(buf, r.Rdata...)
}
