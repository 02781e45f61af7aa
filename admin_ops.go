package compactcache

import (
	"bytes"
	"encoding/binary"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/miekg/dns"
)

// What the admin endpoint does to one block's cache. Flushes of a name and
// lookups probe keys, as Unbound's flush does, rather than scan: the
// question's key for every type, with and without CD, and the ECS variants
// the name's lists hold. Subtree, negative, expired and whole flushes, the
// dump and the stats walk the store a chunk of its ring at a time, each
// chunk under its shard's lock, yielding between chunks, so that queries
// wait at most for one chunk.

// flushes are the flushes begun on a store, for the fetches that began
// before them: a fetch records the generation when it begins, and stores
// its answer only if no flush that began since covers it (putUnflushed).
// A reload hands them over with the store, so that the fetches of the old
// instance and the new one see the flushes of either.
type flushes struct {
	gen atomic.Uint64 // flushes begun

	// mu is held for writing by a flush's begin, and for reading by a put
	// from its check to its store's Put, so that a flush's walk sees every
	// entry that a put checked before the flush began.
	mu     sync.RWMutex
	recent []flushRecord // the last maxFlushRecords, oldest first
}

// flushRecord is one flush: its generation and the entries it removes.
type flushRecord struct {
	gen    uint64
	covers func(e entry.Entry) bool
}

// maxFlushRecords bounds the flushes kept; a fetch older than all of them
// stores nothing.
const maxFlushRecords = 64

// begin records a flush of what covers picks, and bumps the generation:
// fetches begun before it, by any instance that shares the store, store
// nothing it covers after it.
func (fs *flushes) begin(covers func(e entry.Entry) bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.recent) == maxFlushRecords {
		fs.recent = append(fs.recent[:0], fs.recent[1:]...)
	}
	fs.recent = append(fs.recent, flushRecord{gen: fs.gen.Add(1), covers: covers})
}

// since reports whether a flush that began after generation gen covers e;
// the caller holds fs.mu.
func (fs *flushes) since(gen uint64, e entry.Entry) bool {
	if fs.gen.Load() == gen {
		return false
	}
	if len(fs.recent) == 0 || fs.recent[0].gen > gen+1 {
		return true // older than the flushes kept: covered, for all we know
	}
	for _, f := range fs.recent {
		if f.gen > gen && f.covers(e) {
			return true
		}
	}
	return false
}

// putUnflushed stores e, fetched by a fetch that began at generation gen,
// unless a flush that began since covers it: its answer may be one the
// flush removes. A flush that begins once e is checked waits for the put,
// and its walk finds e: e is never held, however briefly, after a flush
// that covers it began. It reports whether e was stored.
func (c *Cache) putUnflushed(gen uint64, e entry.Entry, now int64) (dropped store.Dropped, ok bool) {
	c.flushes.mu.RLock()
	defer c.flushes.mu.RUnlock()
	if c.flushes.since(gen, e) {
		return dropped, false
	}
	return c.put(e, now), true
}

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

// flushName removes every entry of name (lowercased wire form) with one of
// types, and the name's ECS lists.
func (c *Cache) flushName(name []byte, types []uint16) admin.Counts {
	c.flushes.begin(func(e entry.Entry) bool {
		return bytes.Equal(e.QName(), name) && slices.Contains(types, keyType(e))
	})
	var n admin.Counts
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
	return n
}

// lookupName returns every entry of name (lowercased wire form) with one of
// types.
func (c *Cache) lookupName(name []byte, types []uint16) []admin.Entry {
	var held []byte // the entries found, copied out under their shard's lock
	c.nameKeys(name, types, func(key []byte) {
		c.store.Get(key, c.store.Hash(key), func(e entry.Entry) bool {
			if store.KindOf(e) != store.KindMeta {
				held = append(held, e...)
			}
			return true
		})
	})
	return c.describeAll(held, nil)
}

// describeAll describes the entries laid end to end in held, appended to
// dst.
func (c *Cache) describeAll(held []byte, dst []admin.Entry) []admin.Entry {
	now := c.now().Unix()
	rb := newReplyBuffers()
	for off := 0; off < len(held); {
		e := entry.Entry(held[off:])
		e = e[:e.Size()]
		off += len(e)
		dst = append(dst, c.describe(e, now, &rb))
	}
	return dst
}

// walk visits every entry of the store, a chunk of its ring per call under
// the chunk's shard lock. Between chunks, with no lock held, it calls
// between (when given), and stops with its error. After each chunk it
// rests walkRest times as long as the chunk took: a walk of a million
// entries takes tens of milliseconds of a core, and a goroutine that only
// yields (runtime.Gosched) keeps the scheduler from polling the network,
// so that on a server with one core the queries wait for the walk's end.
// Resting, it lets them in after every chunk, and keeps the walk to a
// quarter of a core.
func (c *Cache) walk(visit func(e entry.Entry) (remove bool), between func() error) error {
	return snapshot.Paced(c.store, walkRest)(visit, between)
}

// walkRest is how many times as long as a chunk took a walk rests after it.
var walkRest = time.Duration(3)

// sweep removes the entries covers picks, walking the store.
func (c *Cache) sweep(covers func(e entry.Entry) bool) admin.Counts {
	c.flushes.begin(covers)
	return c.remove(covers)
}

// remove removes the entries pick picks, walking the store, and counts
// them.
func (c *Cache) remove(pick func(e entry.Entry) bool) admin.Counts {
	var n admin.Counts
	c.walk(func(e entry.Entry) bool {
		if !pick(e) {
			return false
		}
		count(&n, store.KindOf(e), 1)
		return true
	}, nil)
	return n
}

// flushZone removes every entry of a name at or below zone (lowercased wire
// form), ECS lists included.
func (c *Cache) flushZone(zone []byte) admin.Counts {
	return c.sweep(func(e entry.Entry) bool { return inZone(e.QName(), zone) })
}

// inZone reports whether name is zone or below it; both are lowercased
// wire names, and zone matches at a label boundary.
func inZone(name, zone []byte) bool {
	for off := 0; len(name)-off >= len(zone); off += int(name[off]) + 1 {
		if len(name)-off == len(zone) {
			return string(name[off:]) == string(zone)
		}
	}
	return false
}

// negative reports the entries flush_negative removes: NXDOMAIN and NODATA
// (the denials) and SERVFAIL.
func negative(e entry.Entry) bool {
	return e.Flags()&entry.FlagMeta == 0 && (e.Flags()&entry.FlagDenial != 0 || e.Rcode() == dns.RcodeServerFailure)
}

func (c *Cache) flushNegative() admin.Counts { return c.sweep(negative) }

// flushExpired removes the entries whose TTL has run out, stale ones that
// serve_stale would still serve included, and the ECS lists whose variants
// all have. No fetch brings an expired answer: fetches in flight need not
// know of it.
func (c *Cache) flushExpired() admin.Counts {
	now := c.now().Unix()
	return c.remove(func(e entry.Entry) bool { return now >= e.Expires() })
}

func (c *Cache) flushAll() admin.Counts {
	return c.sweep(func(entry.Entry) bool { return true })
}

// keyType returns the type of e's question.
func keyType(e entry.Entry) uint16 { return binary.BigEndian.Uint16(e.Key()[len(e.QName()):]) }

// dump describes every entry but the ECS lists, a chunk at a time: each
// chunk's entries are copied out under its lock and described and handed
// to each, whose error ends the dump, with no lock held.
func (c *Cache) dump(each func(batch []admin.Entry) error) error {
	var held []byte
	var batch []admin.Entry
	return c.walk(func(e entry.Entry) bool {
		if store.KindOf(e) != store.KindMeta {
			held = append(held, e...)
		}
		return false
	}, func() error {
		if len(held) == 0 {
			return nil
		}
		batch = c.describeAll(held, batch[:0])
		held = held[:0]
		return each(batch)
	})
}

// stats reads the entries per kind as the store counts them, counts the
// rest of what it holds walking it, and reads the block's counters.
func (c *Cache) stats() admin.Stats {
	var st admin.Stats
	now := c.now().Unix()
	grace := int64(c.staleUpTo / time.Second)
	c.walk(func(e entry.Entry) bool {
		k := store.KindOf(e)
		count(&st.Bytes, k, int64(e.Size()))
		if k == store.KindMeta {
			return false
		}
		switch {
		case e.Rcode() == dns.RcodeServerFailure:
			st.ServFail++
		case e.Rcode() == dns.RcodeNameError:
			st.NXDomain++
		case k == store.KindDenial:
			st.NoData++
		}
		if now >= e.Expires() {
			st.Expired++
			if now-e.Expires() < grace {
				st.Stale++
			}
		}
		return false
	}, nil)
	u := c.store.Usage()
	for k, n := range u.Kinds {
		count(&st.Entries, k, int64(n))
	}
	st.ECSVariants, st.Held, st.Capacity = int64(u.Variants), u.Held, c.store.Capacity()
	c.counters(&st)
	return st
}

// describe says what e holds, at now (unix seconds): its key, flags and
// age, and its records as a DO client would get them, with TTLs aged.
func (c *Cache) describe(e entry.Entry, now int64, rb *replyBuffers) admin.Entry {
	k, qname, qtype := e.Key(), e.QName(), keyType(e)
	qclass := binary.BigEndian.Uint16(k[len(qname)+2:])
	at := entry.FlagsAt(k)
	flags := k[at]
	d := admin.Entry{
		Type:      dns.Type(qtype).String(),
		Class:     dns.Class(qclass).String(),
		CD:        flags&entry.KeyCD != 0,
		NonAnswer: flags&entry.KeyOther != 0,
		NoDNSSEC:  !e.HoldsDNSSEC(),
		Rcode:     dns.RcodeToString[e.Rcode()],
		Kind:      kindLabels[store.KindOf(e)],
		Stored:    int64(e.Stored()),
		TTL:       int64(e.TTL()),
		Bytes:     e.Size(),
		Hits:      e.Hits(),
	}
	d.Name, _, _ = dns.UnpackDomainName(qname, 0)
	switch {
	case flags&entry.KeyECS != 0:
		d.ECS, d.ECSMatch = subnetString(k[at+1], k[at+2], k[at+3:]), "scope"
		if flags&entry.KeyExact != 0 {
			d.ECSMatch = "exact"
		}
	case flags&entry.KeySourceZero != 0:
		d.ECS, d.ECSMatch = subnetString(k[at+1], 0, nil), "source0"
	}
	age := max(0, now-int64(e.Stored()))
	d.TTLLeft = d.TTL - age
	d.Expired = d.TTLLeft <= 0
	d.Stale = d.Expired && -d.TTLLeft < int64(c.staleUpTo/time.Second)

	q := query{opcode: dns.OpcodeQuery, cd: d.CD, do: true, name: qname, qtype: qtype, qclass: qclass, limit: dns.MaxMsgSize}
	var m dns.Msg
	if err := m.Unpack(rb.appendReply(&q, e, replyView{age: uint32(min(age, int64(^uint32(0))))})); err != nil {
		d.Answer = []string{"; records unreadable: " + err.Error()}
		return d
	}
	for _, s := range []struct {
		rrs []dns.RR
		to  *[]string
	}{{m.Answer, &d.Answer}, {m.Ns, &d.Ns}, {m.Extra, &d.Extra}} {
		for _, rr := range s.rrs {
			*s.to = append(*s.to, rr.String())
		}
	}
	return d
}

// subnetString writes the ECS subnet of a key: family, prefix length and
// the address bytes the prefix covers.
func subnetString(family, prefix byte, addr []byte) string {
	var a [16]byte
	copy(a[:], addr[:min(len(addr), entry.PrefixBytes(int(prefix)))])
	ip := netip.AddrFrom16(a)
	if uint16(family) == familyIPv4 {
		ip = netip.AddrFrom4([4]byte(a[:4]))
	}
	return netip.PrefixFrom(ip, int(prefix)).String()
}
