package compactcache

import (
	"context"
	"time"

	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/lifecycle"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/tier"
	"github.com/miekg/dns"
)

// The second tier (internal/tier): a local miss asks it before the next
// plugin, as the leader of the question's flight, and what it finds is
// stored locally and served as a local entry would be, so that its ECS
// scope, CD, DNSSEC records, DO filtering and serve_stale apply as they do
// to the entries the block fetched itself.

// StartShared connects the block to its shared tier, when it has one,
// under the block's view. CoreDNS's startup of the block calls it; a
// program that runs a Cache without CoreDNS's lifecycle calls it, and
// StopShared when done.
func (c *Cache) StartShared(view string) {
	if c.Shared == nil || c.shared != nil {
		return
	}
	c.shared = tier.New(c.Shared, tier.Options{
		Fingerprint: c.fingerprint(),
		Grace:       int64(c.StaleUpTo / time.Second),
		MaxTTL:      int64(max(c.SuccessTTL, c.DenialTTL, c.ServfailTTL) / time.Second),
		Zones:       c.metrics.Zones,
		View:        view,
		Apply:       func(f flush.Flush) { c.flushLocal(f) },
		Since:       c.Snapshot.Restored(),
	})
}

// connected are the blocks whose tiers connected at their startup, until
// their instance's servers are up; the tiers of an instance that never
// starts (a failed reload, which also never shuts down) are closed.
var connected = lifecycle.New(nil, (*Cache).StopShared)

// StopShared closes the block's connections to its shared tier.
func (c *Cache) StopShared() {
	if c.shared != nil {
		c.shared.Close()
	}
}

// fromShared looks s.q, the question of r, up in the tier and, when it holds an entry the
// client can take, stores it locally unless a flush began since gen, and
// returns what a local lookup then finds. A stale entry serves as a local
// one does under serve_stale immediate, refreshed, but counted as the miss
// it was (not in served_stale_total, which counts stale hits); in verify
// mode the miss asks the next plugin instead.
func (c *Cache) fromShared(ctx context.Context, r *dns.Msg, s *scratch, gen uint64, m *cachemetrics.Server) found {
	now := c.now()
	name := s.key[:dnsmsg.WireNameLen(s.key)]
	e := c.shared.Get(ctx, c.sharedKeys(s), name, now.Unix(), s.q.takes)
	if e == nil {
		return found{}
	}
	stored := false
	c.fence.Store(gen, e, func() { // listed before a flush may begin, as in store
		var d store.Displaced
		if d, stored = c.put(e, now.Unix()); stored && e.Flags()&entry.FlagVariant != 0 {
			c.recordVariant(s.builder(), s, e, now.Unix(), m)
		}
		m.Evicted(d)
	})
	if !stored {
		return found{}
	}
	f := c.lookup(s, now, true)
	switch {
	case f.state == stale && c.VerifyStale:
		return found{}
	case f.state == stale:
		c.refreshHit(ctx, r, s, &f, m)
	}
	return f
}

// sharedKeys returns the keys the tier is asked for s.q, in the order a
// local lookup probes them (lookupAt): for ECS the variants of the
// client's subnet, longest prefix first, then the answer for everyone; and
// under prefer_positive the answer before what is kept beside it.
func (c *Cache) sharedKeys(s *scratch) [][]byte {
	q := &s.q
	var keys [][]byte
	add := func(k []byte) {
		keys = append(keys, k)
		if c.PreferPositive {
			o := append([]byte(nil), k...)
			o[entry.FlagsAt(o)] |= entry.KeyOther
			keys = append(keys, o)
		}
	}
	switch {
	case q.ecs.family == 0:
	case q.ecs.sent == 0:
		add(entry.SourceZeroKey(nil, s.key, q.ecs.family))
		fallthrough
	default:
		add(entry.VariantKey(nil, s.key, entry.KeyExact, q.ecs.family, q.ecs.sent, q.ecs.addr))
		for l := int(q.ecs.sent); l >= 0; l-- {
			add(entry.VariantKey(nil, s.key, 0, q.ecs.family, uint8(l), q.ecs.addr))
		}
	}
	add(append([]byte(nil), s.key...))
	return keys
}
