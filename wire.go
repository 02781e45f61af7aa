package compactcache

import (
	"encoding/binary"
	"math"

	"github.com/miekg/dns"
)

// builder packs a response into an entry in reused scratch buffers, so that
// storing it costs one copy into the arena and no allocation.
type builder struct {
	buf []byte // the entry being built
	rr  []byte // one record as dns.PackRR writes it
	key []byte // a derived key
}

func newBuilder() *builder {
	return &builder{buf: make([]byte, 0, maxEntryLen), rr: make([]byte, dns.MaxMsgSize), key: make([]byte, 0, maxNameLen+keyTail)}
}

// otherKey returns key with keyOther set, in b's key buffer.
func (b *builder) otherKey(key []byte) []byte {
	b.key = append(b.key[:0], key...)
	b.key[len(b.key)-1] |= keyOther
	return b.key
}

// build packs the records of m behind the header and key; limit bounds the
// bytes of the records. key is the lowercased wire qname followed by the
// keyTail bytes, as keyFor makes it.
func (b *builder) build(m *dns.Msg, key []byte, stored, ttl uint32, flags uint16, limit int) (entry, error) {
	nameLen := len(key) - keyTail
	b.buf = b.buf[:headerLen]
	binary.LittleEndian.PutUint32(b.buf[offStored:], stored)
	binary.LittleEndian.PutUint32(b.buf[offTTL:], ttl)
	binary.LittleEndian.PutUint16(b.buf[offFlags:], flags)
	binary.LittleEndian.PutUint32(b.buf[offLastHit:], 0) // last hit and hits
	b.buf[offNameLen] = byte(nameLen)
	b.buf = append(b.buf, key...)
	start := len(b.buf)

	qname := key[:nameLen]
	qtype := binary.BigEndian.Uint16(key[nameLen:])
	qclass := binary.BigEndian.Uint16(key[nameLen+2:])
	for s, rrs := range [3][]dns.RR{m.Answer, m.Ns, m.Extra} {
		n := 0
		for _, rr := range rrs {
			if hopByHop(rr.Header().Rrtype) {
				continue
			}
			if err := b.appendRecord(rr, qname, qtype, qclass); err != nil {
				return nil, err
			}
			if len(b.buf)-start > limit {
				return nil, errEntryTooLarge
			}
			n++
		}
		binary.LittleEndian.PutUint16(b.buf[offCounts+2*s:], uint16(n))
	}
	binary.LittleEndian.PutUint32(b.buf[offSize:], uint32(len(b.buf)))
	return entry(b.buf), nil
}

// hopByHop reports the types that belong to one transaction and are never
// cached: OPT (RFC 6891) and TSIG (RFC 8945).
func hopByHop(t uint16) bool { return t == dns.TypeOPT || t == dns.TypeTSIG }

func isDNSSEC(t uint16) bool {
	return t == dns.TypeRRSIG || t == dns.TypeNSEC || t == dns.TypeNSEC3
}

// appendRecord packs rr uncompressed with miekg/dns, then re-lays its fields
// in the record format of entry.go.
func (b *builder) appendRecord(rr dns.RR, qname []byte, qtype, qclass uint16) error {
	end, err := dns.PackRR(rr, b.rr, 0, nil, false)
	if err != nil {
		return err
	}
	w := b.rr[:end]
	nl := wireNameLen(w)
	owner, hdr, rdata := w[:nl], w[nl:nl+10], w[nl+10:]
	rtype := binary.BigEndian.Uint16(hdr[0:])
	class := binary.BigEndian.Uint16(hdr[2:])
	ttl := binary.BigEndian.Uint32(hdr[4:])
	if ttl > math.MaxInt32 {
		ttl = 0 // RFC 2181 section 8: a TTL with the top bit set means zero
	}

	var flags byte
	if equalFoldWire(owner, qname) {
		flags |= recOwnerIsQname
	}
	if rtype == qtype {
		flags |= recTypeIsQtype
	}
	if class == qclass {
		flags |= recClassIsQclass
	}
	if isDNSSEC(rtype) {
		flags |= recDNSSEC
	}
	b.buf = append(b.buf, flags)
	if flags&recOwnerIsQname == 0 {
		b.buf = append(b.buf, owner...)
	}
	if flags&recTypeIsQtype == 0 {
		b.buf = binary.BigEndian.AppendUint16(b.buf, rtype)
	}
	if flags&recClassIsQclass == 0 {
		b.buf = binary.BigEndian.AppendUint16(b.buf, class)
	}
	b.buf = binary.BigEndian.AppendUint32(b.buf, ttl)
	b.buf = binary.BigEndian.AppendUint16(b.buf, uint16(len(rdata)))
	b.buf = append(b.buf, rdata...)
	return nil
}
