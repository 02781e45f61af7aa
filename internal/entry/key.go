package entry

import (
	"encoding/binary"
	"maps"
	"slices"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/miekg/dns"
)

// ScopesLen is the bitmap of prefix lengths 0 to 128.
const ScopesLen = (128 + 8) / 8

const (
	// MaxKeyLen is the longest key: a name, the key tail, a class and an
	// ECS suffix.
	MaxKeyLen = dnsmsg.MaxNameLen + keyTail + 2 + 2 + 16
)

// AppendKey appends the cache key of a question: the lowercased wire qname,
// qtype, the key flags, CD among them, and a class other than IN. The DO
// bit is not part of it: entries keep DNSSEC records and the reply writer
// drops them for DO=0 clients.
func AppendKey(b, qname []byte, qtype, qclass uint16, cd bool) []byte {
	off := len(b)
	b = append(b, qname...)
	dnsmsg.LowerInPlace(b[off:])
	b = append(b, byte(qtype>>8), byte(qtype))
	var flags byte
	if cd {
		flags |= KeyCD
	}
	if qclass == dns.ClassINET {
		return append(b, flags)
	}
	return append(b, flags|keyNotIN, byte(qclass>>8), byte(qclass))
}

// KeyFor returns the cache key of a question whose name is in presentation
// form, for callers that start from text: an operator's lookup, tests.
func KeyFor(name string, qtype, qclass uint16, cd bool) ([]byte, error) {
	var buf [dnsmsg.MaxNameLen]byte
	n, err := dnsmsg.PackName(dns.Fqdn(name), buf[:])
	if err != nil {
		return nil, err
	}
	return AppendKey(nil, buf[:n], qtype, qclass, cd), nil
}

// withFlagsTo appends base to dst with flags added.
func withFlagsTo(dst, base []byte, flags byte) []byte {
	dst = append(dst, base...)
	dst[len(dst)-len(base)+FlagsAt(base)] |= flags
	return dst
}

// keyClass returns the class of the key k, whose qname is nameLen bytes.
func keyClass(k []byte, nameLen int) uint16 {
	at := nameLen + keyTail
	if k[at-1]&keyNotIN == 0 {
		return dns.ClassINET
	}
	return binary.BigEndian.Uint16(k[at:])
}

// suffixAt returns the offset in the key k, whose qname is nameLen bytes,
// of what its flags announce after the class.
func suffixAt(k []byte, nameLen int) int {
	n := nameLen + keyTail
	if k[n-1]&keyNotIN != 0 {
		n += 2
	}
	return n
}

// FlagsAt returns the offset of the key flags in a key.
func FlagsAt(key []byte) int { return dnsmsg.WireNameLen(key) + keyTail - 1 }

// SuffixAt returns the offset in key of what its flags announce after the
// class: the family of an ECS key, and its prefix length and address.
func SuffixAt(key []byte) int { return suffixAt(key, dnsmsg.WireNameLen(key)) }

// VariantKey appends to dst the key of the variant of base for the subnet
// addr/prefix, with flags besides keyECS.
func VariantKey(dst, base []byte, flags byte, family uint16, prefix uint8, addr [16]byte) []byte {
	dst = withFlagsTo(dst, base, KeyECS|flags)
	dst = append(dst, byte(family), prefix)
	m := dnsmsg.Mask(addr, int(prefix))
	return append(dst, m[:dnsmsg.PrefixBytes(int(prefix))]...)
}

func SourceZeroKey(dst, base []byte, family uint16) []byte {
	return append(withFlagsTo(dst, base, KeySourceZero), byte(family))
}

func ScopesKey(dst, base []byte, family uint16) []byte {
	return append(withFlagsTo(dst, base, KeyScopes), byte(family))
}

// Scope returns the prefix length an entry was stored for: the scope its
// reply is echoed with.
func (e Entry) Scope() uint8 {
	k, n := e[offKey:], e.nameLen()
	if k[n+keyTail-1]&KeyECS == 0 {
		return 0
	}
	return k[suffixAt(k, n)+1]
}

// Exact reports whether the entry is an answer whose upstream wanted more
// bits than it was sent: it serves only queries that send as many bits as
// its Scope.
func (e Entry) Exact() bool {
	k, n := e[offKey:], e.nameLen()
	return k[n+keyTail-1]&(KeyECS|KeyExact) == KeyECS|KeyExact
}

// The list of a name's variants, the records of its keyScopes entry:
//
//	scopesLen  bitmap of the prefix lengths of variants, bit L for length L
//	scopesLen  the same for exact variants (keyExact)
//	2          count of variants listed
//	2          head: the index of the oldest
//	2          capacity
//	18 × cap   a ring of variants, oldest at head: exact (0 or 1), prefix
//	           length, address masked to it
//
// A new variant goes into the ring in place; only when the ring is full
// below max_variants is the list written again, twice as large, so that a
// name with k variants costs O(k) bytes of arena, not O(k²).
//
// The list's stored time is when it began: that of the first variant it
// listed, kept when it is written again. A variant stored before it was
// listed by an earlier list, which left the store (evicted) before it: no
// flush of the name finds it through this list, so it is not served.
const (
	listBits     = 0
	listExact    = ScopesLen
	listCount    = 2 * ScopesLen
	listHead     = listCount + 2
	listCap      = listHead + 2
	listItems    = listCap + 2
	itemLen      = 2 + 16
	firstListCap = 4
)

// List is the records of a keyScopes entry.
type List []byte

func (e Entry) List() List { return List(e[e.body():e.Size()]) }

func (l List) Bits() *[ScopesLen]byte  { return (*[ScopesLen]byte)(l[listBits:]) }
func (l List) Exact() *[ScopesLen]byte { return (*[ScopesLen]byte)(l[listExact:]) }
func (l List) Count() int              { return int(binary.LittleEndian.Uint16(l[listCount:])) }
func (l List) head() int               { return int(binary.LittleEndian.Uint16(l[listHead:])) }
func (l List) capacity() int           { return int(binary.LittleEndian.Uint16(l[listCap:])) }

func (l List) Item(i int) Variant {
	b := l[listItems+itemLen*((l.head()+i)%l.capacity()):]
	v := Variant{Exact: b[0] != 0, Prefix: b[1]}
	copy(v.Addr[:], b[2:itemLen])
	return v
}

func (l List) setItem(i int, v Variant) {
	b := l[listItems+itemLen*((l.head()+i)%l.capacity()):]
	b[0], b[1] = 0, v.Prefix
	if v.Exact {
		b[0] = 1
	}
	copy(b[2:itemLen], v.Addr[:])
}

func (l List) set(count, head int) {
	binary.LittleEndian.PutUint16(l[listCount:], uint16(count))
	binary.LittleEndian.PutUint16(l[listHead:], uint16(head))
}

// index recomputes the bitmaps from the ring.
func (l List) index() {
	clear(l[:listCount])
	for i := range l.Count() {
		if v := l.Item(i); v.Exact {
			setBit(l.Exact(), v.Prefix)
		} else {
			setBit(l.Bits(), v.Prefix)
		}
	}
}

func setBit(bits *[ScopesLen]byte, n uint8) { bits[n/8] |= 1 << (n % 8) }

func HasBit(bits *[ScopesLen]byte, n uint8) bool { return bits[n/8]&(1<<(n%8)) != 0 }

// Variant names one ECS variant of a name and family.
type Variant struct {
	Exact  bool
	Prefix uint8
	Addr   [16]byte // masked to prefix
}

// VariantOf returns the variant e stores; e must be one.
func VariantOf(e Entry) Variant {
	k, n := e.Key(), e.nameLen()
	at := suffixAt(k, n)
	v := Variant{Exact: k[n+keyTail-1]&KeyExact != 0, Prefix: k[at+1]}
	copy(v.Addr[:], k[at+2:])
	return v
}

func (v Variant) key(dst, base []byte, family uint16) []byte {
	var flags byte
	if v.Exact {
		flags = KeyExact
	}
	return VariantKey(dst, base, flags, family, v.Prefix, v.Addr)
}

// ListVariant adds v, an entry stored at stored for ttl seconds, to old,
// the list of base's variants of family (nil for none), in place when the
// ring has room. It returns a new list, built in b.meta, when the list must
// be written (anew or larger), and the key of the variant dropped past max
// in b.dropped, or nil.
func ListVariant(b *Builder, old Entry, base []byte, family uint16, v Variant, max int, stored, ttl uint32) (fresh Entry, dropped []byte) {
	if old != nil {
		beginBy(old, stored)
		// Before the lookup for v: a variant listed already, fetched again,
		// outlives the list otherwise, which is then expired while the
		// variant lives, and the lookups that read the list find none.
		outlive(old, int64(stored)+int64(ttl))
		l := old.List()
		for i := range l.Count() {
			if l.Item(i) == v {
				return nil, nil
			}
		}
		switch n := l.Count(); {
		case n < l.capacity():
			l.setItem(n, v)
			l.set(n+1, l.head())
		case n == max:
			b.dropped = l.Item(0).key(b.dropped[:0], base, family)
			l.setItem(0, v) // the oldest's slot is the newest's
			l.set(n, (l.head()+1)%l.capacity())
			dropped = b.dropped
		default:
			return newList(b, old, base, family, v, min(2*l.capacity(), max), stored, ttl), nil
		}
		l.index()
		return nil, dropped
	}
	return newList(b, nil, base, family, v, min(firstListCap, max), stored, ttl), nil
}

// outlive makes the list e live at least until expires, unix seconds: a
// list lives as long as the variants it lists. A list holds no records, so
// moving its TTL changes no record's (see offTTL).
func outlive(e Entry, expires int64) {
	if expires > e.Expires() {
		binary.LittleEndian.PutUint32(e[offTTL:], uint32(expires-int64(e.Stored())))
	}
}

// beginBy moves the start of the list e back to stored, when it came later,
// keeping when it expires: a variant stored before the list began, as one
// from a shared tier may be, is served once listed.
func beginBy(e Entry, stored uint32) {
	if begun := e.Stored(); stored < begun {
		binary.LittleEndian.PutUint32(e[offTTL:], e.TTL()+(begun-stored))
		e.SetStored(stored)
	}
}

// newList builds in b.meta a list of capacity holding old's variants and v.
func newList(b *Builder, old Entry, base []byte, family uint16, v Variant, capacity int, stored, ttl uint32) Entry {
	if old != nil {
		// Written again, the list keeps when it began; it outlives v
		// already (ListVariant).
		stored, ttl = old.Stored(), old.TTL()
	}
	buf := b.meta[:headerLen]
	binary.LittleEndian.PutUint32(buf[offStored:], stored)
	binary.LittleEndian.PutUint32(buf[offTTL:], ttl)
	binary.LittleEndian.PutUint16(buf[offFlags:], FlagMeta)
	binary.LittleEndian.PutUint32(buf[offLastHit:], 0) // last hit and hits
	buf[offNameLen] = byte(dnsmsg.WireNameLen(base))
	buf = ScopesKey(buf, base, family)
	at := len(buf)
	buf = append(buf, make([]byte, listItems+itemLen*capacity)...)
	l := List(buf[at:])
	binary.LittleEndian.PutUint16(l[listCap:], uint16(capacity))
	n := 0
	if old != nil {
		o := old.List()
		for i := range o.Count() {
			l.setItem(i, o.Item(i))
		}
		n = o.Count()
	}
	l.setItem(n, v)
	l.set(n+1, 0)
	l.index()
	putSize(buf)
	b.meta = buf
	return Entry(buf)
}

// ProbeTypes are the types a probe of a name's keys tries when given none:
// every type miekg/dns has a name for.
var ProbeTypes = slices.Sorted(maps.Keys(dns.TypeToString))

// probeClasses are the classes a probe tries.
var probeClasses = []uint16{dns.ClassINET, dns.ClassCHAOS}

// Probed reports whether a probe of a name's keys given no types finds an
// entry of qtype and qclass: a cache stores no other, which a flush of its
// name would miss.
func Probed(qtype, qclass uint16) bool {
	return probedTypes[qtype/8]&(1<<(qtype%8)) != 0 && slices.Contains(probeClasses, qclass)
}

// probedTypes is ProbeTypes as a bit set, which every miss reads: a load,
// where the map of names is a lookup.
var probedTypes = func() (set [1 << 16 / 8]byte) {
	for _, t := range ProbeTypes {
		set[t/8] |= 1 << (t % 8)
	}
	return set
}()

// Probe says which keys NameKeys gives.
type Probe struct {
	Types []uint16 // ProbeTypes when empty
	// Other: the non-answers kept beside answers (KeyOther), which only a
	// cache under serve_stale_policy prefer_positive stores.
	Other bool
	// Variants appends to dst the ECS variants the list under key holds.
	Variants func(key []byte, dst []Variant) []Variant
}

// NameKeys calls f with each key an entry of name (lowercased wire form)
// may be stored under: the question's for every type and class probed,
// with and without CD; answers to ECS source /0 queries and the variants
// the name's ECS lists hold, each list after its variants; and the
// non-answers beside each when p.Other. f must not keep key. A flush or
// lookup of a name probes these rather than walk the store, as Unbound's
// flush does.
func NameKeys(name []byte, p Probe, f func(key []byte)) {
	types := p.Types
	if len(types) == 0 {
		types = ProbeTypes
	}
	var base, key, other [MaxKeyLen]byte
	each := func(k []byte) {
		f(k)
		if p.Other {
			o := append(other[:0], k...)
			o[FlagsAt(o)] |= KeyOther
			f(o)
		}
	}
	var variants []Variant
	for _, t := range types {
		for _, class := range probeClasses {
			for _, cd := range []bool{false, true} {
				b := AppendKey(base[:0], name, t, class, cd)
				each(b)
				for _, family := range []uint16{dnsmsg.FamilyIPv4, dnsmsg.FamilyIPv6} {
					each(SourceZeroKey(key[:0], b, family))
					list := ScopesKey(key[:0], b, family)
					variants = p.Variants(list, variants[:0])
					var vk [MaxKeyLen]byte
					for _, v := range variants {
						var flags byte
						if v.Exact {
							flags = KeyExact
						}
						each(VariantKey(vk[:0], b, flags, family, v.Prefix, v.Addr))
					}
					if len(variants) > 0 {
						f(list)
					}
				}
			}
		}
	}
}
