// Package entry is the one place that knows the entry format: a cached
// response packed into bytes (Builder builds one from a reply, Check checks
// one read from outside the process, Entry and Record read one), the keys
// entries are stored under (the question, CD, the ECS variant), and the
// ECS lists that say which variants a name has. The store keeps entries
// without reading their records; the reply writer reads them.
package entry

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"net"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/miekg/dns"
)

// An entry is one cached response packed into bytes. It lives in a shard's
// arena and is found through the shard's integer index, so the cache holds no
// Go pointer per entry and the garbage collector never walks the entries.
//
// Own fields are little endian (the hit path reads them on amd64 and arm64);
// names and rdata stay in DNS wire format so a hit copies them verbatim.
//
//	offset  size  field
//	0       3     size of the entry, header included
//	3       1     N: length of the qname in wire form
//	4       4     stored: unix seconds when the response was stored
//	8       4     ttl: the entry's TTL in seconds, already clamped; fixed
//	              once the entry is built, since records that drop their
//	              own TTL (recTTLIsEntry) read it back from here
//	12      2     flags: rcode (low 2 bits), plain, DNSSEC, AA, RA, AD, ...
//	14      2     last hit: seconds after stored, modulo 2^16
//	16      2     hits in the current popularity window, saturating
//	18      K     key: lowercased wire qname, qtype (big endian), key
//	              flags, the qclass when not IN (keyNotIN), and for ECS
//	              the suffix the flags announce (key.go)
//	18+K    ...   the body: the answer, authority and additional counts
//	              (2 bytes each) and the records, see record below; the
//	              plain records alone with flagPlain; the variant list of a
//	              FlagMeta entry (key.go)
//
// flagPlain is the common answer: only records of the question's name, type
// and class in the answer section, with the entry's TTL and none that only
// DO clients get. Such records are stored as their rdata alone, after its
// 2-byte length unless the type fixes the length (A, AAAA: fixedRdlen), and
// their count is what the body holds: the counts and each record's flags
// would repeat what the question says.
const (
	OffSize    = 0
	offNameLen = 3
	offStored  = 4
	offTTL     = 8
	offFlags   = 12
	offLastHit = 14
	offHits    = 16
	offKey     = 18

	headerLen = offKey
	keyTail   = 3 // qtype and key flags after the qname
	countsLen = 6 // the three section counts of a body that has them
	sizeMask  = 1<<24 - 1

	// MinLen is the fewest bytes an entry takes: a header and the key of
	// the root name.
	MinLen = headerLen + 1 + keyTail

	// MaxLen bounds any entry: the largest DNS message, the header, the
	// longest key and the section counts. Arena chunks are sized to hold one
	// such entry.
	MaxLen = 64<<10 + headerLen + MaxKeyLen + countsLen
)

// Format numbers the layout below, so that a build does not read the
// entries of another: snapshots and a shared tier's values name it in their
// fingerprint.
const Format = 3

// Entry flags.
const (
	// FlagRcodeMask: the cache stores NOERROR, SERVFAIL and NXDOMAIN only
	// (classify), so two bits hold every rcode an entry has.
	FlagRcodeMask = 0x0003
	// flagPlain: the body is plain records (see the layout above).
	flagPlain = 1 << 2
	// FlagDNSSEC: the entry holds every record the upstream sent, the
	// DNSSEC ones that only DO clients get (DNSSECOnly) included, and so
	// serves DO clients as well as the others. Without it, the entry was
	// stored for a client without DO and such records were left out of it
	// (Builder.Build). An entry's is read by HoldsDNSSEC only.
	FlagDNSSEC  = 1 << 3
	FlagAA      = 1 << 4
	FlagRA      = 1 << 5
	FlagAD      = 1 << 6
	FlagDenial  = 1 << 7 // counted against the denial capacity
	FlagAnswers = 1 << 8 // a success that answers its question (serve_stale_policy)
	// FlagReferred and FlagFreqHigh are a counter of hits, 0 to 3: added
	// to by each hit, taken from each time the store's eviction passes the
	// entry and keeps it (Freq).
	FlagReferred = 1 << 9
	FlagMeta     = 1 << 10 // the cache's bookkeeping, not a response
	FlagVariant  = 1 << 11 // tailored to a client subnet (ECS)
	FlagNXName   = 1 << 12 // a compact denial of a name (RFC 9824): NXDOMAIN without DO
	// flagShortProof: DNSSEC records that only DO clients get expire before
	// the entry; DO clients read the entry's lifetime from them (proofTTL).
	FlagShortProof = 1 << 13
	// flagNoECS: fetched without ECS, so tailored to no client or to this
	// server's own address; it serves clients without ECS and source /0
	// queries only (RFC 7871 7.3.1 makes only an answer to an ECS query
	// good for every client).
	FlagNoECS    = 1 << 14
	FlagFreqHigh = 1 << 15
)

// MaxFreq is the most hits an entry counts (Freq).
const MaxFreq = 3

// Key flags: the bits of the request, besides the question, that select an
// entry. DO is not one of them: one entry serves DO and non-DO clients.
const (
	KeyCD = 1 << 0
	// keyOther keeps denials and non-answers apart from the answer they would
	// replace, under serve_stale_policy prefer_positive.
	KeyOther = 1 << 1
	// keyECS marks an answer tailored to a client subnet; the key goes on
	// with the family, the stored prefix length and the masked address.
	KeyECS = 1 << 2
	// keySourceZero marks an answer to a query with ECS source /0: it serves
	// only such queries of its family (RFC 7871 7.3.1); the key goes on with
	// the family.
	KeySourceZero = 1 << 3
	// keyScopes marks the entry listing a name's ECS variants; the key goes
	// on with the family.
	KeyScopes = 1 << 4
	// keyExact marks, with keyECS, an answer whose scope was longer than the
	// source prefix sent: the upstream needs more bits than it was given, so
	// the answer serves only queries that give as many as it had (RFC 7871
	// 7.3.1).
	KeyExact = 1 << 5
	// keyNotIN marks a question of a class other than IN, which the key
	// goes on with after the flags; the key of an IN question leaves its
	// class out.
	keyNotIN = 1 << 6

	// keyFlags are the key flags there are: a key with another was not
	// built.
	keyFlags = KeyCD | KeyOther | KeyECS | KeySourceZero | KeyScopes | KeyExact | keyNotIN
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
	RecOwnerIsQname  = 1 << 0
	recTypeIsQtype   = 1 << 1
	recClassIsQclass = 1 << 2
	RecDNSSEC        = 1 << 3 // only for DO clients, see dnssecOnly
	// recTTLIsEntry: the record's TTL is the entry's. A reply gives each
	// record the lower of its own TTL and the entry's, so a TTL no lower
	// than the entry's need not be kept: that of nearly every record.
	RecTTLIsEntry = 1 << 4

	// recFlags are the record flags there are: a record with another was
	// not built.
	recFlags = RecOwnerIsQname | recTypeIsQtype | recClassIsQclass | RecDNSSEC | RecTTLIsEntry
)

var ErrTooLarge = errors.New("entry larger than the per-entry limit")

type Entry []byte

// SizeAt returns the size of the entry at the start of b.
func SizeAt(b []byte) int { return int(binary.LittleEndian.Uint32(b[OffSize:]) & sizeMask) }

// putSize sets the size of the entry b, which is len(b).
func putSize(b []byte) {
	n := len(b)
	b[OffSize], b[OffSize+1], b[OffSize+2] = byte(n), byte(n>>8), byte(n>>16)
}

func (e Entry) Size() int      { return SizeAt(e) }
func (e Entry) Stored() uint32 { return binary.LittleEndian.Uint32(e[offStored:]) }
func (e Entry) TTL() uint32    { return binary.LittleEndian.Uint32(e[offTTL:]) }
func (e Entry) Flags() uint16  { return binary.LittleEndian.Uint16(e[offFlags:]) }
func (e Entry) Rcode() int     { return int(e.Flags() & FlagRcodeMask) }
func (e Entry) nameLen() int   { return int(e[offNameLen]) }
func (e Entry) Key() []byte    { return e[offKey:e.body()] }
func (e Entry) QName() []byte  { return e[offKey : offKey+e.nameLen()] }
func (e Entry) body() int      { return offKey + keyLen(e[offKey:], e.nameLen()) }

// SetStored moves the second e was stored at to t, and its last use with
// it (LastUsed counts from it): for a snapshot written by a clock ahead of
// the reader's.
func (e Entry) SetStored(t uint32) { binary.LittleEndian.PutUint32(e[offStored:], t) }

// HoldsDNSSEC reports whether e serves DO clients: it holds the DNSSEC
// records the upstream sent (FlagDNSSEC).
func (e Entry) HoldsDNSSEC() bool { return e.Flags()&FlagDNSSEC != 0 }

// Records sets counts to how many records each section of e holds (the
// answer, authority and additional) and returns the offset of the first
// (Record). The counts go to the caller's array: an array returned by value
// travels through memory under Go's calling convention, a store and a load
// on every hit.
func (e Entry) Records(counts *[3]int) (off int) {
	off = e.body()
	*counts = [3]int{}
	switch f := e.Flags(); {
	case f&flagPlain != 0:
		counts[0] = plainCount(e[off:e.Size()], e.QType())
	case f&FlagMeta == 0:
		for s := range counts {
			counts[s] = int(binary.LittleEndian.Uint16(e[off+2*s:]))
		}
		off += countsLen
	}
	return off
}

// plainCount returns how many plain records of type qtype body holds.
func plainCount(body []byte, qtype uint16) int {
	if n := fixedRdlen(qtype); n > 0 {
		// n is a power of two: a shift, not a division on every hit.
		return len(body) >> bits.TrailingZeros(uint(n))
	}
	n := 0
	for off := 0; off < len(body); n++ {
		off += 2 + int(binary.BigEndian.Uint16(body[off:]))
	}
	return n
}

// fixedRdlen returns the rdata length that every record of type t has, whose
// plain records are stored without it, or 0 when their lengths vary. Each
// is a power of two (plainCount shifts by it; TestFixedRdlens).
func fixedRdlen(t uint16) int {
	switch t {
	case dns.TypeA:
		return net.IPv4len
	case dns.TypeAAAA:
		return net.IPv6len
	}
	return 0
}

// rdataLen returns the rdata length of every record of type t, 0 where it
// varies: a type of fixed fields alone. An address (fixedRdlen) may also
// be empty, as miekg/dns packs an A or AAAA without one.
func rdataLen(t uint16) int {
	switch t {
	case dns.TypeEUI48:
		return 6
	case dns.TypeEUI64:
		return 8
	case dns.TypeNID, dns.TypeL64:
		return 10
	case dns.TypeLOC:
		return 16
	}
	return fixedRdlen(t)
}

// keyLen returns the length of the key at the start of b, whose qname is
// nameLen bytes: the key flags say what follows them.
func keyLen(b []byte, nameLen int) int {
	n := suffixAt(b, nameLen)
	switch flags := b[nameLen+keyTail-1]; {
	case flags&KeyECS != 0:
		n += 2 + dnsmsg.PrefixBytes(int(b[n+1])) // family, prefix length, address
	case flags&(KeyScopes|KeySourceZero) != 0:
		n++ // family
	}
	return n
}

// QType is the type of the entry's question.
func (e Entry) QType() uint16 {
	return binary.BigEndian.Uint16(e[offKey+e.nameLen():])
}

// QClass is the class of the entry's question.
func (e Entry) QClass() uint16 { return keyClass(e[offKey:], e.nameLen()) }

// ProofTTL returns the entry's lifetime for DO clients: its TTL, or less when
// it holds DNSSEC records (those that only DO clients get) that expire first.
func (e Entry) ProofTTL() uint32 {
	ttl := e.TTL()
	if e.Flags()&FlagShortProof == 0 {
		return ttl
	}
	var r Record
	var counts [3]int
	off, qtype := e.Records(&counts), e.QType()
	for s, n := range counts {
		for range n {
			off = e.Record(off, &r)
			if r.Flags&RecDNSSEC != 0 && !AskedFor(r.Type, s, qtype) {
				ttl = min(ttl, r.TTL)
			}
		}
	}
	return ttl
}

// Idle returns the seconds from the entry's last hit, or its storing, to now.
// The last hit is kept modulo 2^16 seconds, so that a hit of an entry older
// than that still tells a gap: only an idle time of more reads short.
func (e Entry) Idle(now int64) int64 {
	return int64(uint16(e.since(now)) - binary.LittleEndian.Uint16(e[offLastHit:]))
}

// Expires returns the unix second at which the entry's TTL runs out.
func (e Entry) Expires() int64 { return int64(e.Stored()) + int64(e.TTL()) }

// Popularity returns the hits as the stock cache's prefetch counts them:
// those in a row with no gap of the prefetch window between them (Hit).
func (e Entry) Popularity() int { return int(binary.LittleEndian.Uint16(e[offHits:])) }

// Hit records a hit at now, unix seconds, for eviction (Freq) and for
// popularity as the stock cache's prefetch counts it: hits with no gap of
// window seconds or more between them.
func (e Entry) Hit(now int64, window int64) {
	e.SetFreq(e.Freq() + 1)
	hits := e.PopularityAfterHit(now, window)
	binary.LittleEndian.PutUint16(e[offLastHit:], uint16(e.since(now)))
	binary.LittleEndian.PutUint16(e[offHits:], uint16(hits))
}

// PopularityAfterHit returns the popularity a hit at now would leave, without
// recording it.
func (e Entry) PopularityAfterHit(now int64, window int64) int {
	hits := e.Popularity()
	switch {
	case e.Idle(now) > window:
		return 1
	case hits < math.MaxUint16:
		return hits + 1
	}
	return hits
}

// since returns the seconds from the entry's storing to now, 0 if now is
// earlier.
func (e Entry) since(now int64) int64 { return max(0, now-int64(e.Stored())) }

// SetPopularity carries popularity over to an entry that replaced one.
func (e Entry) SetPopularity(n int) {
	binary.LittleEndian.PutUint16(e[offHits:], uint16(min(n, math.MaxUint16)))
}

// Freq returns the hits the entry counts for eviction, 0 to MaxFreq:
// those since it was stored, less the times the store's eviction has passed
// it since.
func (e Entry) Freq() int {
	f := e.Flags()
	return int(f&FlagReferred)>>9 | int(f&FlagFreqHigh)>>14
}

// SetFreq sets the count of hits Freq returns, at most MaxFreq.
func (e Entry) SetFreq(n int) {
	n = min(max(n, 0), MaxFreq)
	f := e.Flags()&^(FlagReferred|FlagFreqHigh) | uint16(n&1)<<9 | uint16(n&2)<<14
	binary.LittleEndian.PutUint16(e[offFlags:], f)
}

// Record is one resource record of an entry, sliced out of the entry's bytes.
type Record struct {
	Flags byte
	Owner []byte // nil when the owner is the qname
	Type  uint16
	Class uint16
	TTL   uint32
	Rdata []byte
}

// Record parses the record at off into r and returns the offset of the
// next. The entry was built by builder or passed Check, so the lengths are
// trusted. It sets
// r's fields one by one: a record built whole and copied out is read back
// 16 bytes at a time from its narrower stores, a store-forwarding stall on
// every record of every reply. Plain records, most of those a hit reads,
// are read here and the others in a call of their own.
func (e Entry) Record(off int, r *Record) int {
	if e.Flags()&flagPlain == 0 {
		return e.formatRecord(off, r)
	}
	r.Flags, r.Owner, r.Type, r.Class, r.TTL = plainFlags, nil, e.QType(), e.QClass(), e.TTL()
	r.Rdata, off = e.PlainRdata(off, r.Type)
	return off
}

// PlainRdata returns the rdata of the plain record at off of e, a plain
// entry whose question's type is qtype, and the offset of the next record:
// all that differs from one plain record to the next.
func (e Entry) PlainRdata(off int, qtype uint16) ([]byte, int) {
	rdlen := fixedRdlen(qtype)
	if rdlen == 0 {
		rdlen = int(binary.BigEndian.Uint16(e[off:]))
		off += 2
	}
	return e[off : off+rdlen], off + rdlen
}

// Plain reports whether e's body is plain records (see the layout above):
// records of its question's name, type and class, in the answer section,
// with its TTL, none of them for DO clients only.
func (e Entry) Plain() bool { return e.Flags()&flagPlain != 0 }

// plainFlags are the flags a plain record would have in the record format.
const plainFlags = RecOwnerIsQname | recTypeIsQtype | recClassIsQclass | RecTTLIsEntry

// formatRecord is Record for a record in the record format.
func (e Entry) formatRecord(off int, r *Record) int {
	r.Flags, r.Owner, r.Type, r.Class = e[off], nil, e.QType(), e.QClass()
	off++
	if r.Flags&RecOwnerIsQname == 0 {
		n := dnsmsg.WireNameLen(e[off:])
		r.Owner = e[off : off+n]
		off += n
	}
	if r.Flags&recTypeIsQtype == 0 {
		r.Type = binary.BigEndian.Uint16(e[off:])
		off += 2
	}
	if r.Flags&recClassIsQclass == 0 {
		r.Class = binary.BigEndian.Uint16(e[off:])
		off += 2
	}
	r.TTL = e.TTL()
	if r.Flags&RecTTLIsEntry == 0 {
		r.TTL = binary.BigEndian.Uint32(e[off:])
		off += 4
	}
	rdlen := int(binary.BigEndian.Uint16(e[off:]))
	off += 2
	r.Rdata = e[off : off+rdlen]
	return off + rdlen
}

// ReplyTTL is the TTL a record of TTL rec takes in a reply from an entry of
// TTL ttl at age seconds: its own while shorter than the entry's, which is
// the clamped one, less the age, and 0 once that is spent.
func ReplyTTL(rec, ttl, age uint32) uint32 {
	t := min(rec, ttl)
	if age >= t {
		return 0
	}
	return t - age
}
