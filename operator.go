package compactcache

import (
	"encoding/binary"
	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/snapshot"
	"io"
	"net/netip"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/entry"
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

// operator is a block's cache as the admin endpoint (adminserver.Cache)
// and snapshots and warm-ups (persist.Cache) reach it, which the plugin's
// own API does not show.
type operator struct{ c *Cache }

func (o operator) Flush(f flush.Flush) admin.Counts { return o.c.Flush(f) }
func (o operator) Lookup(name []byte, types []uint16) []admin.Entry {
	return o.c.lookupName(name, types)
}
func (o operator) Dump(each func(batch []admin.Entry) error) error { return o.c.dump(each) }
func (o operator) Stats() admin.Stats                              { return o.c.stats() }

func (o operator) Store() *store.Store               { return o.c.store }
func (o operator) Fingerprint() snapshot.Fingerprint { return o.c.fingerprint() }
func (o operator) Now() int64                        { return o.c.now().Unix() }
func (o operator) Grace() int64                      { return int64(o.c.staleUpTo / time.Second) }

func (o operator) Snapshot(w io.Writer) (int, error) {
	return snapshot.Write(w, o.c.store.Paced(0), o.c.fingerprint(), o.c.now().Unix())
}

// lookupName returns every entry of name (lowercased wire form) with one of
// types.
func (c *Cache) lookupName(name []byte, types []uint16) []admin.Entry {
	if len(types) == 0 {
		types = probeTypes
	}
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
	t := c.metrics.Totals(c.listen)
	st.Requests, st.Hits, st.Misses = t.Requests, t.Hits, t.Misses
	for k, n := range t.Evictions {
		count(&st.Evictions, k, n)
	}
	if st.Requests > 0 {
		st.HitRatio = float64(st.Hits) / float64(st.Requests)
	}
	return st
}

// describe says what e holds, at now (unix seconds): its key, flags and
// age, and its records as a DO client would get them, with TTLs aged.
func (c *Cache) describe(e entry.Entry, now int64, rb *replyBuffers) admin.Entry {
	k, qname, qtype := e.Key(), e.QName(), e.QType()
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
		Kind:      cachemetrics.KindLabels[store.KindOf(e)],
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
