package compactcache

import (
	"maps"
	"slices"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/miekg/dns"
)

// The invalidation seam: every flush, an operator's, a peer replica's or
// one the Kubernetes API calls for, is a flush.Flush applied here. Flushes
// of names probe the keys their entries may be stored under, as Unbound's
// flush does, rather than scan; the others walk the store a chunk of its
// ring at a time, resting between chunks (walkRest).

// Flush drops the entries f covers from the store and counts them. Fetches
// in flight that began before it store nothing it covers (flush.Fence).
func (c *Cache) Flush(f flush.Flush) admin.Counts {
	now := c.now().Unix()
	if f.Fenced() {
		c.fence.Begin(func(e entry.Entry) bool { return f.Covers(e, now) })
	}
	if f.Scope == flush.Names {
		return c.flushNames(f.Names, f.Types)
	}
	var n admin.Counts
	c.walk(func(e entry.Entry) bool {
		if !f.Covers(e, now) {
			return false
		}
		count(&n, store.KindOf(e), 1)
		return true
	}, nil)
	return n
}

// flushNames removes every entry of names with one of types (every type
// probeTypes has when types is empty), and the names' ECS lists.
func (c *Cache) flushNames(names [][]byte, types []uint16) admin.Counts {
	if len(types) == 0 {
		types = probeTypes
	}
	var n admin.Counts
	for _, name := range names {
		c.nameKeys(name, types, func(key []byte) {
			kind := -1
			if c.store.Get(key, c.store.Hash(key), func(e entry.Entry) bool {
				kind = store.KindOf(e)
				return true
			}) {
				c.store.Remove(key)
				count(&n, kind, 1)
			}
		})
	}
	return n
}

// walk visits every entry of the store at the pace of walkRest; between
// (when given) runs after each chunk with no lock held, and stops the walk
// with its error.
func (c *Cache) walk(visit func(e entry.Entry) (remove bool), between func() error) error {
	return c.store.Paced(walkRest)(visit, between)
}

// walkRest is how many times as long as a chunk took a walk rests after
// it, keeping a walk to a quarter of a core.
var walkRest = time.Duration(3)

// count counts one entry of kind k.
func count(n *admin.Counts, k int, by int64) {
	switch k {
	case store.KindSuccess:
		n.Success += by
	case store.KindDenial:
		n.Denial += by
	default:
		n.ECSList += by
	}
}

// probeTypes are the types a flush or lookup of a name probes: every type
// miekg/dns has a name for. A type outside them is found by flush_zone.
var probeTypes = slices.Sorted(maps.Keys(dns.TypeToString))

// probeClasses are the classes probed with them.
var probeClasses = []uint16{dns.ClassINET, dns.ClassCHAOS}

// nameKeys calls f with each key an entry for name (lowercased wire form)
// and one of types may be stored under: the question's, with and without
// CD; answers to ECS source /0 queries and the variants the name's ECS
// lists hold, each list after its variants; and under prefer_positive the
// non-answers kept beside each (keyOther). f must not keep key.
func (c *Cache) nameKeys(name []byte, types []uint16, f func(key []byte)) {
	var base, key, other [entry.MaxKeyLen]byte
	both := func(k []byte) {
		f(k)
		o := append(other[:0], k...)
		o[entry.FlagsAt(o)] |= entry.KeyOther
		f(o)
	}
	var variants []entry.Variant
	for _, t := range types {
		for _, class := range probeClasses {
			for _, cd := range []bool{false, true} {
				b := entry.AppendKey(base[:0], name, t, class, cd)
				both(b)
				for _, family := range []uint16{familyIPv4, familyIPv6} {
					both(entry.SourceZeroKey(key[:0], b, family))
					list := entry.ScopesKey(key[:0], b, family)
					variants = c.listed(list, variants[:0])
					var vk [entry.MaxKeyLen]byte
					for _, v := range variants {
						var flags byte
						if v.Exact {
							flags = entry.KeyExact
						}
						both(entry.VariantKey(vk[:0], b, flags, family, v.Prefix, v.Addr))
					}
					if len(variants) > 0 {
						f(list)
					}
				}
			}
		}
	}
}

// listed appends to dst the variants the list under key holds.
func (c *Cache) listed(key []byte, dst []entry.Variant) []entry.Variant {
	c.store.Get(key, c.store.Hash(key), func(e entry.Entry) bool {
		l := e.List()
		for i := range l.Count() {
			dst = append(dst, l.Item(i))
		}
		return true
	})
	return dst
}
