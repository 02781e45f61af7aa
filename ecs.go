package compactcache

import (
	"encoding/binary"
	"net"

	"github.com/miekg/dns"
)

// EDNS Client Subnet (RFC 7871). An answer tailored to a client subnet is
// stored under the key of its question followed by the family, the stored
// prefix length L and the client's address masked to L, where L is the
// smallest of the source prefix sent upstream and the scope the upstream
// answered with. A lookup walks the prefix lengths stored for the name, from
// the client's source prefix down, and ends with the entry that serves
// everyone. Which lengths are stored is kept per name and family in a
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
	family uint16 // 0 when the request goes upstream without ECS
	source uint8  // the client's SOURCE PREFIX-LENGTH, echoed back to it
	sent   uint8  // the source prefix sent upstream: at most the configured one
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
	if !cfg.add {
		return true
	}
	var ip net.IP
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.TCPAddr:
		ip = a.IP
	default:
		return true
	}
	if ip4 := ip.To4(); ip4 != nil {
		q.ecs.family = familyIPv4
		copy(q.ecs.addr[:], ip4)
	} else {
		q.ecs.family = familyIPv6
		copy(q.ecs.addr[:], ip.To16())
	}
	q.ecs.sent = uint8(cfg.maxSource(q.ecs.family))
	q.ecs.source = q.ecs.sent
	q.ecs.addr = mask(q.ecs.addr, int(q.ecs.sent))
	return true
}

func (cfg *ecsConfig) maxSource(family uint16) int {
	if family == familyIPv4 {
		return cfg.source4
	}
	return cfg.source6
}

func (cfg *ecsConfig) fromOption(q *query, e *dns.EDNS0_SUBNET) bool {
	if e.Family != familyIPv4 && e.Family != familyIPv6 || int(e.SourceNetmask) > familyBits(e.Family) {
		return false
	}
	s := subnet{family: e.Family, source: e.SourceNetmask, own: true}
	if e.Family == familyIPv4 {
		ip4 := e.Address.To4()
		if ip4 == nil && e.Address != nil {
			return false
		}
		copy(s.addr[:], ip4)
	} else {
		copy(s.addr[:], e.Address.To16())
	}
	if mask(s.addr, int(s.source)) != s.addr {
		return false
	}
	s.echo = s.addr
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
		b.key = withFlagsTo(b.key[:0], base, keySourceZero)
		return b.key, false, true
	}
	l := min(s.sent, e.SourceScope)
	if l == 0 {
		return base, false, true
	}
	b.key = variantKey(b.key[:0], base, s.family, l, s.addr)
	return b.key, true, true
}

// withFlagsTo appends base to dst with flags added.
func withFlagsTo(dst, base []byte, flags byte) []byte {
	dst = append(dst, base...)
	dst[flagsAt(dst)] |= flags
	return dst
}

// flagsAt returns the offset of the key flags in a key.
func flagsAt(key []byte) int { return wireNameLen(key) + keyTail - 1 }

// variantKey appends to dst the key of the variant of base for the subnet
// addr/prefix.
func variantKey(dst, base []byte, family uint16, prefix uint8, addr [16]byte) []byte {
	dst = append(dst, base...)
	dst[flagsAt(dst)] |= keyECS
	dst = append(dst, byte(family), prefix)
	m := mask(addr, int(prefix))
	return append(dst, m[:prefixBytes(int(prefix))]...)
}

func scopesKey(dst, base []byte, family uint16) []byte {
	dst = append(dst, base...)
	dst[flagsAt(dst)] |= keyScopes
	return append(dst, byte(family))
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
//	scopesLen  bitmap of the prefix lengths stored, bit L for length L
//	...        the variants, oldest first: prefix length, masked address

// scopes returns the bitmap of prefix lengths stored for the name.
func (e entry) scopes() [scopesLen]byte {
	var bits [scopesLen]byte
	copy(bits[:], e[e.recordsStart():])
	return bits
}

func hasScope(bits *[scopesLen]byte, l uint8) bool { return bits[l/8]&(1<<(l%8)) != 0 }

// withVariant builds in b.meta the list old extended with the variant
// prefix/addr, the oldest variant dropped past max, and returns it with the
// dropped variant's key in b.dropped (nil for none). It returns a nil list
// when the variant is listed already.
func withVariant(b *builder, old entry, base []byte, family uint16, prefix uint8, addr [16]byte, max int, stored, ttl uint32) (list entry, dropped []byte) {
	buf := b.meta[:headerLen]
	binary.LittleEndian.PutUint32(buf[offStored:], stored)
	binary.LittleEndian.PutUint32(buf[offTTL:], ttl)
	binary.LittleEndian.PutUint16(buf[offFlags:], flagMeta)
	binary.LittleEndian.PutUint64(buf[offCounts:], 0) // no sections; last hit, hits
	buf[offNameLen] = byte(wireNameLen(base))
	buf = scopesKey(buf, base, family)
	bitsAt := len(buf)
	buf = append(buf, make([]byte, scopesLen)...)

	me := variantTail(prefix, addr)
	var items [][]byte
	if old != nil {
		if e := old.expires(); e > int64(stored)+int64(ttl) {
			binary.LittleEndian.PutUint32(buf[offTTL:], uint32(e-int64(stored)))
		}
		for v := old[old.recordsStart()+scopesLen:]; len(v) > 0; {
			n := 1 + prefixBytes(int(v[0]))
			if string(v[:n]) == string(me) {
				return nil, nil // listed already
			}
			items = append(items, v[:n])
			v = v[n:]
		}
	}
	items = append(items, me)
	if len(items) > max {
		var a [16]byte
		copy(a[:], items[0][1:])
		b.dropped = variantKey(b.dropped[:0], base, family, items[0][0], a)
		dropped = b.dropped
		items = items[1:]
	}
	for _, v := range items {
		buf[bitsAt+int(v[0])/8] |= 1 << (v[0] % 8)
		buf = append(buf, v...)
	}
	binary.LittleEndian.PutUint32(buf[offSize:], uint32(len(buf)))
	b.meta = buf
	return entry(buf), dropped
}

func variantTail(prefix uint8, addr [16]byte) []byte {
	m := mask(addr, int(prefix))
	return append([]byte{prefix}, m[:prefixBytes(int(prefix))]...)
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
