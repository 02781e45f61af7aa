package compactcache

import (
	"encoding/binary"
	"errors"
	"math"
)

// An entry is one cached response packed into bytes. It lives in a shard's
// arena and is found through the shard's integer index, so the cache holds no
// Go pointer per entry and the garbage collector never walks the entries.
//
// Own fields are little endian (the hit path reads them on amd64 and arm64);
// names and rdata stay in DNS wire format so a hit copies them verbatim.
//
//	offset  size  field
//	0       4     size of the entry, header included
//	4       4     stored: unix seconds when the response was stored
//	8       4     ttl: the entry's TTL in seconds, already clamped; fixed
//	              once the entry is built, since records that drop their
//	              own TTL (recTTLIsEntry) read it back from here
//	12      2     flags: rcode (low 4 bits), AA, RA, AD, denial, ...
//	14      2     answer count
//	16      2     authority count
//	18      2     additional count
//	20      2     last hit: seconds after stored, saturating
//	22      2     hits in the current popularity window, saturating
//	24      1     N: length of the qname in wire form
//	25      K     key: lowercased wire qname, qtype, qclass (big endian), key
//	              flags, and for ECS the suffix the flags announce (ecs.go)
//	25+K    ...   records, see record below
const (
	offSize    = 0
	offStored  = 4
	offTTL     = 8
	offFlags   = 12
	offCounts  = 14
	offLastHit = 20
	offHits    = 22
	offNameLen = 24
	offKey     = 25

	headerLen = offKey
	keyTail   = 5 // qtype, qclass, key flags after the qname

	// maxEntryLen bounds any entry: the largest DNS message, the header and
	// the longest key. Arena chunks are sized to hold one such entry.
	maxEntryLen = 64<<10 + headerLen + maxKeyLen
)

// Entry flags.
const (
	flagRcodeMask = 0x000f
	flagAA        = 1 << 4
	flagRA        = 1 << 5
	flagAD        = 1 << 6
	flagDenial    = 1 << 7  // counted against the denial capacity
	flagAnswers   = 1 << 8  // a success that answers its question (serve_stale_policy)
	flagReferred  = 1 << 9  // hit since written or since the ring last passed it
	flagMeta      = 1 << 10 // the cache's bookkeeping, not a response
	flagVariant   = 1 << 11 // tailored to a client subnet (ECS)
	flagNXName    = 1 << 12 // a compact denial of a name (RFC 9824): NXDOMAIN without DO
	// flagShortProof: DNSSEC records that only DO clients get expire before
	// the entry; DO clients read the entry's lifetime from them (proofTTL).
	flagShortProof = 1 << 13
	// flagNoECS: fetched without ECS, so tailored to no client or to this
	// server's own address; it serves clients without ECS and source /0
	// queries only (RFC 7871 7.3.1 makes only an answer to an ECS query
	// good for every client).
	flagNoECS = 1 << 14
)

// Key flags: the bits of the request, besides the question, that select an
// entry. DO is not one of them: one entry serves DO and non-DO clients.
const (
	keyCD = 1 << 0
	// keyOther keeps denials and non-answers apart from the answer they would
	// replace, under serve_stale_policy prefer_positive.
	keyOther = 1 << 1
	// keyECS marks an answer tailored to a client subnet; the key goes on
	// with the family, the stored prefix length and the masked address.
	keyECS = 1 << 2
	// keySourceZero marks an answer to a query with ECS source /0: it serves
	// only such queries of its family (RFC 7871 7.3.1); the key goes on with
	// the family.
	keySourceZero = 1 << 3
	// keyScopes marks the entry listing a name's ECS variants; the key goes
	// on with the family.
	keyScopes = 1 << 4
	// keyExact marks, with keyECS, an answer whose scope was longer than the
	// source prefix sent: the upstream needs more bits than it was given, so
	// the answer serves only queries that give as many as it had (RFC 7871
	// 7.3.1).
	keyExact = 1 << 5
)

// Record flags. A record is
//
//	1      flags
//	[name] owner, uncompressed wire form, absent with recOwnerIsQname
//	[2]    type, absent with recTypeIsQtype
//	[2]    class, absent with recClassIsQclass
//	[4]    TTL as received, 0 for one with the top bit set (wireTTL);
//	       absent with recTTLIsEntry
//	2      rdata length
//	[n]    rdata, uncompressed wire form
//
// with the integers in network order, as in the message they came from.
const (
	recOwnerIsQname  = 1 << 0
	recTypeIsQtype   = 1 << 1
	recClassIsQclass = 1 << 2
	recDNSSEC        = 1 << 3 // only for DO clients, see dnssecOnly
	// recTTLIsEntry: the record's TTL is the entry's. A reply gives each
	// record the lower of its own TTL and the entry's, so a TTL no lower
	// than the entry's need not be kept: that of nearly every record.
	recTTLIsEntry = 1 << 4
)

var errEntryTooLarge = errors.New("entry larger than the per-entry limit")

type entry []byte

func (e entry) size() int         { return int(binary.LittleEndian.Uint32(e[offSize:])) }
func (e entry) stored() uint32    { return binary.LittleEndian.Uint32(e[offStored:]) }
func (e entry) ttl() uint32       { return binary.LittleEndian.Uint32(e[offTTL:]) }
func (e entry) flags() uint16     { return binary.LittleEndian.Uint16(e[offFlags:]) }
func (e entry) count(s int) int   { return int(binary.LittleEndian.Uint16(e[offCounts+2*s:])) }
func (e entry) denial() bool      { return e.flags()&flagDenial != 0 }
func (e entry) rcode() int        { return int(e.flags() & flagRcodeMask) }
func (e entry) nameLen() int      { return int(e[offNameLen]) }
func (e entry) key() []byte       { return e[offKey : offKey+keyLen(e[offKey:], e.nameLen())] }
func (e entry) qname() []byte     { return e[offKey : offKey+e.nameLen()] }
func (e entry) recordsStart() int { return offKey + keyLen(e[offKey:], e.nameLen()) }

// keyLen returns the length of the key at the start of b, whose qname is
// nameLen bytes: the key flags say which suffix follows them.
func keyLen(b []byte, nameLen int) int {
	n := nameLen + keyTail
	switch flags := b[n-1]; {
	case flags&keyECS != 0:
		n += 2 + prefixBytes(int(b[n+1])) // family, prefix length, address
	case flags&(keyScopes|keySourceZero) != 0:
		n++ // family
	}
	return n
}

func (e entry) qtype() uint16 {
	return binary.BigEndian.Uint16(e[offKey+e.nameLen():])
}

func (e entry) qclass() uint16 {
	return binary.BigEndian.Uint16(e[offKey+e.nameLen()+2:])
}

// proofTTL returns the entry's lifetime for DO clients: its TTL, or less when
// it holds DNSSEC records (those that only DO clients get) that expire first.
func (e entry) proofTTL() uint32 {
	ttl := e.ttl()
	if e.flags()&flagShortProof == 0 {
		return ttl
	}
	var r record
	off, qtype := e.recordsStart(), e.qtype()
	for s := range 3 {
		for range e.count(s) {
			off = e.record(off, &r)
			if r.flags&recDNSSEC != 0 && !askedFor(r.rtype, s, qtype) {
				ttl = min(ttl, r.ttl)
			}
		}
	}
	return ttl
}

// expires returns the unix second at which the entry's TTL runs out.
func (e entry) expires() int64 { return int64(e.stored()) + int64(e.ttl()) }

func (e entry) setFlag(f uint16, on bool) {
	v := e.flags() &^ f
	if on {
		v |= f
	}
	binary.LittleEndian.PutUint16(e[offFlags:], v)
}

func (e entry) hits() int { return int(binary.LittleEndian.Uint16(e[offHits:])) }

// hit records a hit at now, unix seconds, for second chance eviction and for
// popularity as the stock cache's prefetch counts it: hits with no gap of
// window seconds or more between them.
func (e entry) hit(now int64, window int64) {
	e.setFlag(flagReferred, true)
	since := max(0, now-int64(e.stored()))
	last := int64(binary.LittleEndian.Uint16(e[offLastHit:]))
	hits := e.hits()
	switch {
	case since-last > window && last < math.MaxUint16:
		hits = 1
	case hits < math.MaxUint16:
		hits++
	}
	binary.LittleEndian.PutUint16(e[offLastHit:], uint16(min(since, math.MaxUint16)))
	binary.LittleEndian.PutUint16(e[offHits:], uint16(hits))
}

// setHits carries popularity over to an entry that replaced one.
func (e entry) setHits(n int) {
	binary.LittleEndian.PutUint16(e[offHits:], uint16(min(n, math.MaxUint16)))
}

func (e entry) referenced() bool { return e.flags()&flagReferred != 0 }

// passed clears the second chance the ring has just spent.
func (e entry) passed() { e.setFlag(flagReferred, false) }

// record is one resource record of an entry, sliced out of the entry's bytes.
type record struct {
	flags byte
	owner []byte // nil when the owner is the qname
	rtype uint16
	class uint16
	ttl   uint32
	rdata []byte
}

// record parses the record at off into r and returns the offset of the
// next. The entry was built by builder, so the lengths are trusted. It sets
// r's fields one by one: a record built whole and copied out is read back
// 16 bytes at a time from its narrower stores, a store-forwarding stall on
// every record of every reply.
func (e entry) record(off int, r *record) int {
	r.flags, r.owner, r.rtype, r.class = e[off], nil, e.qtype(), e.qclass()
	off++
	if r.flags&recOwnerIsQname == 0 {
		n := wireNameLen(e[off:])
		r.owner = e[off : off+n]
		off += n
	}
	if r.flags&recTypeIsQtype == 0 {
		r.rtype = binary.BigEndian.Uint16(e[off:])
		off += 2
	}
	if r.flags&recClassIsQclass == 0 {
		r.class = binary.BigEndian.Uint16(e[off:])
		off += 2
	}
	r.ttl = e.ttl()
	if r.flags&recTTLIsEntry == 0 {
		r.ttl = binary.BigEndian.Uint32(e[off:])
		off += 4
	}
	rdlen := int(binary.BigEndian.Uint16(e[off:]))
	off += 2
	r.rdata = e[off : off+rdlen]
	return off + rdlen
}

// wireNameLen returns the length of the uncompressed wire name at the start
// of b, the root label included.
func wireNameLen(b []byte) int {
	off := 0
	for b[off] != 0 {
		off += int(b[off]) + 1
	}
	return off + 1
}
