package compactcache

import (
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/store"

	"github.com/compactcache/compactcache/internal/entry"
	"github.com/miekg/dns"
)

// What of a reply and its request becomes an entry: the key it is stored
// under and the flags it carries. The bytes are laid out by internal/entry;
// the decisions, which follow the stock cache, RFC 7871 and the Corefile,
// are the plugin's.

// entryFlags returns the flags of the entry m becomes under verdict v.
func entryFlags(m *dns.Msg, v verdict) uint16 {
	f := uint16(m.Rcode) & entry.FlagRcodeMask
	if m.Authoritative {
		f |= entry.FlagAA
	}
	if m.RecursionAvailable {
		f |= entry.FlagRA
	}
	if m.AuthenticatedData {
		f |= entry.FlagAD
	}
	if v.kind == store.KindDenial {
		f |= entry.FlagDenial
	}
	if v.answers {
		f |= entry.FlagAnswers
	}
	if v.nxname {
		f |= entry.FlagNXName
	}
	return f
}

// storeKey returns the key to store reply under, given the ECS sent with q,
// in b's key buffer, and whether the variant goes into the name's list. ok
// is false for a reply whose ECS does not echo what was sent (RFC 7871 7.3:
// a forgery or a broken server): it is not cached.
func storeKey(b *entry.Builder, base []byte, q *query, reply *dns.Msg) (key []byte, variant, ok bool) {
	s := &q.ecs
	if s.family == 0 {
		return base, false, true
	}
	e := dnsmsg.Subnet(reply)
	if e == nil {
		return base, false, true // no ECS: scope 0, for everyone (7.3.1)
	}
	if e.Family != s.family || e.SourceNetmask != s.sent {
		return nil, false, false
	}
	var addr [16]byte
	if s.family == dnsmsg.FamilyIPv4 {
		copy(addr[:], e.Address.To4())
	} else {
		copy(addr[:], e.Address.To16())
	}
	if dnsmsg.Mask(addr, int(s.sent)) != s.addr {
		return nil, false, false
	}
	if s.sent == 0 {
		b.Key = entry.SourceZeroKey(b.Key[:0], base, s.family)
		return b.Key, false, true
	}
	// Scope 0 makes the answer good for every address of the family, and
	// only of the family: it is the variant of prefix 0.
	if e.SourceScope > s.sent {
		b.Key = entry.VariantKey(b.Key[:0], base, entry.KeyExact, s.family, s.sent, s.addr)
		return b.Key, true, true
	}
	b.Key = entry.VariantKey(b.Key[:0], base, 0, s.family, e.SourceScope, s.addr)
	return b.Key, true, true
}
