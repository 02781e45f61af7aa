package compactcache

import (
	"encoding/binary"
	"net"
	"net/netip"

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

const (
	familyIPv4 = 1
	familyIPv6 = 2

	defaultSource4     = 24
	defaultSource6     = 56
	defaultMaxVariants = 100

	// scopesLen is the bitmap of prefix lengths 0 to 128.
	scopesLen = (128 + 8) / 8
)

// ecsConfig is the `ecs` option: the longest source prefixes sent upstream,
// whether to add ECS for clients that sent none, and the variants kept per
// name and family.
type ecsConfig struct {
	source4, source6 int
	add              bool
	maxVariants      int
}

func defaultECS() ecsConfig {
	return ecsConfig{source4: defaultSource4, source6: defaultSource6, maxVariants: defaultMaxVariants}
}

// subnet is the ECS of one request (RFC 7871 6).
type subnet struct {
	family uint16   // 0 when the request goes upstream without ECS
	source uint8    // the client's SOURCE PREFIX-LENGTH, echoed back to it
	sent   uint8    // the source prefix sent upstream: at most the configured one
	addr   [16]byte // masked to sent
	echo   [16]byte // masked to source
	own    bool     // the client sent it; an ECS the cache added is not echoed
}

func prefixBytes(prefix int) int { return (prefix + 7) / 8 }

func familyBits(family uint16) int {
	if family == familyIPv4 {
		return 32
	}
	return 128
}

// mask zeroes the bits of addr past prefix.
func mask(addr [16]byte, prefix int) [16]byte {
	var m [16]byte
	n := prefix / 8
	copy(m[:n], addr[:n])
	if rest := prefix % 8; rest != 0 {
		m[n] = addr[n] & ^byte(0xFF>>rest)
	}
	return m
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
	if cfg.add {
		cfg.addClient(q, remoteIP(w))
	}
	return true
}

// remoteIP returns the client's address, invalid when it has none.
func remoteIP(w dns.ResponseWriter) netip.Addr {
	var ip net.IP
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.TCPAddr:
		ip = a.IP
	}
	addr, _ := netip.AddrFromSlice(ip)
	return addr
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
		s.family = familyIPv4
		a := ip.As4()
		copy(s.addr[:], a[:])
	} else {
		s.family = familyIPv6
		s.addr = ip.As16()
	}
	s.sent = uint8(cfg.maxSource(s.family))
	s.source = s.sent
	s.addr = mask(s.addr, int(s.sent))
}

func (cfg *ecsConfig) maxSource(family uint16) int {
	if family == familyIPv4 {
		return cfg.source4
	}
	return cfg.source6
}

func (cfg *ecsConfig) fromOption(q *query, e *dns.EDNS0_SUBNET) bool {
	var addr [16]byte
	if e.Family == familyIPv4 {
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
	if family != familyIPv4 && family != familyIPv6 || int(source) > familyBits(family) {
		return false
	}
	if mask(addr, int(source)) != addr {
		return false
	}
	s := subnet{family: family, source: source, addr: addr, echo: addr, own: true}
	s.sent = uint8(min(int(s.source), cfg.maxSource(s.family)))
	s.addr = mask(s.addr, int(s.sent))
	q.ecs = s
	return true
}

// option returns the ECS option for a request carrying s with prefix bits.
func (s *subnet) option(prefix uint8) *dns.EDNS0_SUBNET {
	n := 4
	if s.family == familyIPv6 {
		n = 16
	}
	addr := mask(s.addr, int(prefix))
	return &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: s.family, SourceNetmask: prefix, Address: net.IP(addr[:n])}
}

// setSubnet replaces any ECS option of o by e, or removes it when e is nil.
func setSubnet(o *dns.OPT, e *dns.EDNS0_SUBNET) {
	opts := make([]dns.EDNS0, 0, len(o.Option)+1)
	for _, opt := range o.Option {
		if _, ok := opt.(*dns.EDNS0_SUBNET); !ok {
			opts = append(opts, opt)
		}
	}
	if e != nil {
		opts = append(opts, e)
	}
	o.Option = opts
}

// replySubnet returns the ECS option of a reply, or nil.
func replySubnet(m *dns.Msg) *dns.EDNS0_SUBNET {
	if o := m.IsEdns0(); o != nil {
		for _, opt := range o.Option {
			if e, ok := opt.(*dns.EDNS0_SUBNET); ok {
				return e
			}
		}
	}
	return nil
}

// storeKey returns the key to store reply under, given the ECS sent with q,
// in b's key buffer, and whether the variant goes into the name's list. ok
// is false for a reply whose ECS does not echo what was sent (RFC 7871 7.3:
// a forgery or a broken server): it is not cached.
func storeKey(b *builder, base []byte, q *query, reply *dns.Msg) (key []byte, variant, ok bool) {
	s := &q.ecs
	if s.family == 0 {
		return base, false, true
	}
	e := replySubnet(reply)
	if e == nil {
		return base, false, true // no ECS: scope 0, for everyone (7.3.1)
	}
	if e.Family != s.family || e.SourceNetmask != s.sent {
		return nil, false, false
	}
	var addr [16]byte
	if s.family == familyIPv4 {
		copy(addr[:], e.Address.To4())
	} else {
		copy(addr[:], e.Address.To16())
	}
	if mask(addr, int(s.sent)) != s.addr {
		return nil, false, false
	}
	if s.sent == 0 {
		b.key = sourceZeroKey(b.key[:0], base, s.family)
		return b.key, false, true
	}
	// Scope 0 makes the answer good for every address of the family, and
	// only of the family: it is the variant of prefix 0.
	if e.SourceScope > s.sent {
		b.key = variantKey(b.key[:0], base, keyExact, s.family, s.sent, s.addr)
		return b.key, true, true
	}
	b.key = variantKey(b.key[:0], base, 0, s.family, e.SourceScope, s.addr)
	return b.key, true, true
}

// withFlagsTo appends base to dst with flags added.
func withFlagsTo(dst, base []byte, flags byte) []byte {
	dst = append(dst, base...)
	dst[len(dst)-len(base)+flagsAt(base)] |= flags
	return dst
}

// flagsAt returns the offset of the key flags in a key.
func flagsAt(key []byte) int { return wireNameLen(key) + keyTail - 1 }

// variantKey appends to dst the key of the variant of base for the subnet
// addr/prefix, with flags besides keyECS.
func variantKey(dst, base []byte, flags byte, family uint16, prefix uint8, addr [16]byte) []byte {
	dst = withFlagsTo(dst, base, keyECS|flags)
	dst = append(dst, byte(family), prefix)
	m := mask(addr, int(prefix))
	return append(dst, m[:prefixBytes(int(prefix))]...)
}

func sourceZeroKey(dst, base []byte, family uint16) []byte {
	return append(withFlagsTo(dst, base, keySourceZero), byte(family))
}

func scopesKey(dst, base []byte, family uint16) []byte {
	return append(withFlagsTo(dst, base, keyScopes), byte(family))
}

// scope returns the prefix length an entry was stored for: the scope its
// reply is echoed with.
func (e entry) scope() uint8 {
	k := e.key()
	f := flagsAt(k)
	if k[f]&keyECS == 0 {
		return 0
	}
	return k[f+2]
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
const (
	listBits     = 0
	listExact    = scopesLen
	listCount    = 2 * scopesLen
	listHead     = listCount + 2
	listCap      = listHead + 2
	listItems    = listCap + 2
	itemLen      = 2 + 16
	firstListCap = 4
)

// list is the records of a keyScopes entry.
type list []byte

func (e entry) list() list { return list(e[e.recordsStart():]) }

func (l list) bits() *[scopesLen]byte  { return (*[scopesLen]byte)(l[listBits:]) }
func (l list) exact() *[scopesLen]byte { return (*[scopesLen]byte)(l[listExact:]) }
func (l list) count() int              { return int(binary.LittleEndian.Uint16(l[listCount:])) }
func (l list) head() int               { return int(binary.LittleEndian.Uint16(l[listHead:])) }
func (l list) capacity() int           { return int(binary.LittleEndian.Uint16(l[listCap:])) }

func (l list) item(i int) variant {
	b := l[listItems+itemLen*((l.head()+i)%l.capacity()):]
	v := variant{exact: b[0] != 0, prefix: b[1]}
	copy(v.addr[:], b[2:itemLen])
	return v
}

func (l list) setItem(i int, v variant) {
	b := l[listItems+itemLen*((l.head()+i)%l.capacity()):]
	b[0], b[1] = 0, v.prefix
	if v.exact {
		b[0] = 1
	}
	copy(b[2:itemLen], v.addr[:])
}

func (l list) set(count, head int) {
	binary.LittleEndian.PutUint16(l[listCount:], uint16(count))
	binary.LittleEndian.PutUint16(l[listHead:], uint16(head))
}

// index recomputes the bitmaps from the ring.
func (l list) index() {
	clear(l[:listCount])
	for i := range l.count() {
		if v := l.item(i); v.exact {
			setBit(l.exact(), v.prefix)
		} else {
			setBit(l.bits(), v.prefix)
		}
	}
}

func setBit(bits *[scopesLen]byte, n uint8) { bits[n/8] |= 1 << (n % 8) }

func hasBit(bits *[scopesLen]byte, n uint8) bool { return bits[n/8]&(1<<(n%8)) != 0 }

// variant names one ECS variant of a name and family.
type variant struct {
	exact  bool
	prefix uint8
	addr   [16]byte // masked to prefix
}

// variantOf returns the variant e stores; e must be one.
func variantOf(e entry) variant {
	k := e.key()
	f := flagsAt(k)
	v := variant{exact: k[f]&keyExact != 0, prefix: k[f+2]}
	copy(v.addr[:], k[f+3:])
	return v
}

func (v variant) key(dst, base []byte, family uint16) []byte {
	var flags byte
	if v.exact {
		flags = keyExact
	}
	return variantKey(dst, base, flags, family, v.prefix, v.addr)
}

// listVariant adds v to old, the list of base's variants of family (nil for
// none), in place when the ring has room. It returns a new list, built in
// b.meta, when the list must be written (anew or larger), and the key of
// the variant dropped past max in b.dropped, or nil.
func listVariant(b *builder, old entry, base []byte, family uint16, v variant, max int, stored, ttl uint32) (fresh entry, dropped []byte) {
	if old != nil {
		l := old.list()
		for i := range l.count() {
			if l.item(i) == v {
				return nil, nil
			}
		}
		outlive(old, int64(stored)+int64(ttl))
		switch n := l.count(); {
		case n < l.capacity():
			l.setItem(n, v)
			l.set(n+1, l.head())
		case n == max:
			b.dropped = l.item(0).key(b.dropped[:0], base, family)
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
func outlive(e entry, expires int64) {
	if expires > e.expires() {
		binary.LittleEndian.PutUint32(e[offTTL:], uint32(expires-int64(e.stored())))
	}
}

// newList builds in b.meta a list of capacity holding old's variants and v.
func newList(b *builder, old entry, base []byte, family uint16, v variant, capacity int, stored, ttl uint32) entry {
	buf := b.meta[:headerLen]
	binary.LittleEndian.PutUint32(buf[offStored:], stored)
	binary.LittleEndian.PutUint32(buf[offTTL:], ttl)
	binary.LittleEndian.PutUint16(buf[offFlags:], flagMeta)
	binary.LittleEndian.PutUint64(buf[offCounts:], 0) // no sections; last hit, hits
	buf[offNameLen] = byte(wireNameLen(base))
	buf = scopesKey(buf, base, family)
	at := len(buf)
	buf = append(buf, make([]byte, listItems+itemLen*capacity)...)
	l := list(buf[at:])
	binary.LittleEndian.PutUint16(l[listCap:], uint16(capacity))
	n := 0
	if old != nil {
		o := old.list()
		for i := range o.count() {
			l.setItem(i, o.item(i))
		}
		n = o.count()
		outlive(entry(buf), old.expires())
	}
	l.setItem(n, v)
	l.set(n+1, 0)
	l.index()
	binary.LittleEndian.PutUint32(buf[offSize:], uint32(len(buf)))
	b.meta = buf
	return entry(buf)
}

// appendSubnet writes the ECS option echoed to a client that sent s: its
// family, source prefix and address, and the scope the answer was stored
// for (RFC 7871 7.2.2).
func appendSubnet(b []byte, s *subnet, scope uint8) []byte {
	n := prefixBytes(int(s.source))
	b = binary.BigEndian.AppendUint16(b, dns.EDNS0SUBNET)
	b = binary.BigEndian.AppendUint16(b, uint16(4+n))
	b = binary.BigEndian.AppendUint16(b, s.family)
	b = append(b, s.source, min(scope, s.source))
	return append(b, s.echo[:n]...)
}
