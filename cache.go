// Package compactcache implements a DNS cache for CoreDNS that stores each
// response as packed wire bytes in pointer-free arenas and serves hits by
// writing those bytes into the reply.
package compactcache

import (
	"context"
	"time"

	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flights"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/persist"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/tier"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/miekg/dns"
)

// upstreamUDPSize is the least EDNS buffer of the cache's own queries, which
// fits signed answers (the DNS flag day 2020 value); a client's larger is kept.
const upstreamUDPSize = 1232

// Cache is the compactcache plugin.
type Cache struct {
	Next plugin.Handler
	config.Settings

	store *store.Store
	zones dnsmsg.ZoneSet // Zones, matched against keys
	ecs   ecsConfig

	refreshes refreshes
	flights   flights.Flights
	fence     *flush.Fence // the flushes begun on the store, handed over with it; see Flush
	shared    *tier.Tier   // the second tier, nil without one; see shared.go

	plan    plan // what the block's other plugins ask of the cache
	metrics *cachemetrics.Block
	listen  []string // the addresses of the block's servers, as the metrics' server label names them
	now     func() time.Time
}

// New returns a Cache with the stock cache's defaults and a 64 MiB budget.
func New() *Cache {
	c, err := newCache(config.Defaults())
	if err != nil {
		panic(err) // the defaults are valid
	}
	return c
}

// newCache returns a Cache of settings s.
func newCache(s config.Settings) (*Cache, error) {
	c := &Cache{
		Settings:  s,
		zones:     dnsmsg.NewZoneSet(s.Zones),
		ecs:       ecsConfig{s.ECS},
		refreshes: newRefreshes(),
		metrics:   &cachemetrics.Block{},
		now:       wallNow,
	}
	c.metrics.Store = func() *store.Store { return c.store }
	return c, c.init()
}

// init makes the store for the configured budget and caps, and its record
// fence.
func (c *Cache) init() (err error) {
	c.store, err = store.New(c.Capacity, store.PerKind{store.KindSuccess: c.SuccessCap, store.KindDenial: c.DenialCap}, int64(c.StaleUpTo/time.Second))
	c.fence = &flush.Fence{}
	return err
}

// Name implements plugin.Handler.
func (c *Cache) Name() string { return pluginName }

// Ready implements the ready plugin's Readiness: not ready while a block
// of the process fills its store from a peer.
func (c *Cache) Ready() bool { return !persist.Warming() }

// Stats is a snapshot of the store's occupancy.
type Stats struct {
	Entries  int64 // entries stored, success and denial
	Bytes    int64 // bytes the store holds: arenas, index and bookkeeping
	Capacity int64 // the byte budget
}

// Stats returns the store's occupancy.
func (c *Cache) Stats() Stats {
	u := c.store.Usage()
	return Stats{
		Entries:  int64(u.Kinds[store.KindSuccess] + u.Kinds[store.KindDenial]),
		Bytes:    u.Held,
		Capacity: c.store.Capacity(),
	}
}

// SetRawWrites makes hits reach the client through w.Write with the reply
// bytes instead of WriteMsg with a *dns.Msg built from them. Setup turns it on
// when no plugin in the server block needs WriteMsg.
func (c *Cache) SetRawWrites(on bool) { c.plan.raw, c.plan.rotate = on, false }

// scratch holds one request's buffers; scratches are pooled so that a hit
// allocates nothing.
type scratch struct {
	q       query
	name    [dnsmsg.MaxNameLen]byte
	key     []byte // the cache key (entry.AppendKey)
	probe   []byte // a key derived from key for a lookup
	opts    []byte // the request's EDNS options echoed in the reply
	replies replyBuffers
	b       *entry.Builder // the entry a fetch stores; nil until the scratch's first

	// alone marks the front end's scratch: it answers fresh hits alone and
	// hands the rest to the chain, whose lookup counts their hit, once.
	alone bool

	// born is when the list of the variants a lookup probes began (0 for
	// other keys): a variant stored before is one no flush finds (entry's
	// list layout), not served.
	born uint32
}

// builder returns s's entry builder, made at its first use: hits, most
// requests, need none, and the one they may carry costs no pool of its own.
func (s *scratch) builder() *entry.Builder {
	if s.b == nil {
		s.b = entry.NewBuilder()
	}
	return s.b
}

// transfer reports whether qtype asks for a zone transfer.
func transfer(qtype uint16) bool { return qtype == dns.TypeAXFR || qtype == dns.TypeIXFR }

// ServeDNS implements plugin.Handler.
func (c *Cache) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	// Only queries are cached: an UPDATE or a NOTIFY for a cached name must
	// reach the handlers behind the cache.
	if r.Opcode != dns.OpcodeQuery || len(r.Question) == 0 {
		return plugin.NextOrFailure(c.Name(), c.Next, ctx, w, r)
	}
	s := scratchPool.Get().(*scratch)
	defer scratchPool.Put(s)
	ok := s.readMsg(r, w, &c.ecs)
	if len(s.key) == 0 || !c.serves(s.key) {
		return plugin.NextOrFailure(c.Name(), c.Next, ctx, w, r)
	}
	m := c.metrics.Server(metrics.WithServer(ctx))
	m.Requests.Inc()
	// Nor are queries of several questions or for transfers (streams a miss's
	// capture would cut short): passed on untouched, they count as misses, as
	// in the stock cache. A malformed ECS option gets FORMERR (RFC 7871 6).
	if !ok || len(r.Question) != 1 || transfer(r.Question[0].Qtype) {
		m.Misses.Inc()
		if !ok && len(r.Question) == 1 {
			return dns.RcodeSuccess, w.WriteMsg(new(dns.Msg).SetRcode(r, dns.RcodeFormatError))
		}
		return plugin.NextOrFailure(c.Name(), c.Next, ctx, w, r)
	}
	// Written as bytes, a reply goes around loadbalance: rotated here.
	s.q.rotate = c.plan.raw && c.plan.rotate

	// No time yet: the lookup reads the clock when it finds an entry to age,
	// so that a miss reads it once, when it stores the reply.
	f := c.lookup(s, time.Time{}, !c.VerifyStale)
	switch f.state {
	case fresh:
		m.Hits[f.kind].Inc()
		if f.prefetch {
			c.refreshHit(ctx, r, s, &f, m)
		}
		return dns.RcodeSuccess, c.write(w, f.reply)
	case stale:
		// A hit, verified or not: the stock cache counts it before it
		// verifies, so that requests are hits and misses.
		m.Hits[f.kind].Inc()
		if c.VerifyStale {
			if done, rcode, err := c.verify(ctx, w, r, s, &f, m); done {
				return rcode, err
			}
			switch f = c.lookup(s, f.now, true); f.state {
			case absent:
				return c.miss(ctx, w, r, s, &f, m) // gone meanwhile: ask as for a miss, counted as a hit
			case fresh:
				// Refreshed meanwhile, or what the verify kept beside (prefer_positive).
				return dns.RcodeSuccess, c.write(w, f.reply)
			}
		} else {
			c.refreshHit(ctx, r, s, &f, m)
		}
		m.Stale.Inc()
		return dns.RcodeSuccess, c.write(w, f.reply)
	}
	m.Misses.Inc()
	return c.miss(ctx, w, r, s, &f, m)
}

// serves reports whether the cache handles the name key starts with: in its
// zones and not in a zone that an authoritative plugin of the block asked to
// bypass.
func (c *Cache) serves(key []byte) bool {
	return c.zones.Matches(key) && (len(c.plan.bypass) == 0 || !c.plan.bypass.Matches(key))
}

// Lookup states.
const (
	absent = iota
	fresh
	stale // expired, within the serve_stale window
)

// found is what a lookup found for a request.
type found struct {
	state    int
	kind     int
	hash     uint64    // the key's hash, naming the entry for refreshes
	reply    []byte    // valid until the scratch's next reply
	prefetch bool      // popular and near expiry
	scope    uint8     // the ECS prefix length the entry was stored for
	noECS    bool      // the entry was fetched without ECS, and is refreshed so
	dnssec   bool      // the entry holds its DNSSEC records: refreshes keep them
	now      time.Time // the time the lookup aged entries at

	// upgrade: the client found an entry it cannot take that serves others
	// (without the DNSSEC records a DO client needs, past its proof, or
	// fetched without ECS); its miss fetches it again as a refresh of it,
	// which inherits its popularity and which a failure does not replace.
	upgrade    bool
	popularity int
}

// lookup finds the entry for s.q and writes the reply from it; a stale
// entry's reply is written only when withStale is set. With ECS it tries the
// variants stored for the client's subnet, longest prefix first, then the
// answer for everyone. A zero now is read from the clock when an entry is
// found; found.now is the time used.
//
// The chain below lookup fills one found through a pointer rather than
// returning it: a hit runs on the stack of a request's new goroutine, and a
// copy of found in every frame took it past 4 KiB, so that every hit copied
// its stack to a larger one, a cost of microseconds.
func (c *Cache) lookup(s *scratch, now time.Time, withStale bool) found {
	var f found
	c.lookupAt(s, &now, withStale, &f)
	f.now = now
	return f
}

// at returns *now, read from the clock first if it is zero.
func (c *Cache) at(now *time.Time) time.Time {
	if now.IsZero() {
		*now = c.now()
	}
	return *now
}

// lookupAt fills f from the first entry found for s.q.
func (c *Cache) lookupAt(s *scratch, now *time.Time, withStale bool, f *found) {
	q := &s.q
	s.born = 0
	switch {
	case q.ecs.family == 0:
	case q.ecs.sent == 0:
		s.probe = entry.SourceZeroKey(s.probe[:0], s.key, q.ecs.family)
		if c.lookupKey(s, s.probe, now, withStale, f) {
			return
		}
		fallthrough // then a scope /0 variant, good for every address
	default:
		normal, exact, ok := c.variants(s, now)
		for l := int(q.ecs.sent); ok && l >= 0; l-- {
			// An answer whose upstream wanted more bits than it got serves
			// only queries that give as many bits as it had.
			if l == int(q.ecs.sent) && entry.HasBit(&exact, uint8(l)) {
				s.probe = entry.VariantKey(s.probe[:0], s.key, entry.KeyExact, q.ecs.family, uint8(l), q.ecs.addr)
				if c.lookupKey(s, s.probe, now, withStale, f) {
					return
				}
			}
			if entry.HasBit(&normal, uint8(l)) {
				s.probe = entry.VariantKey(s.probe[:0], s.key, 0, q.ecs.family, uint8(l), q.ecs.addr)
				if c.lookupKey(s, s.probe, now, withStale, f) {
					return
				}
			}
		}
		s.born = 0
	}
	c.lookupKey(s, s.key, now, withStale, f)
}

// variants returns the bitmaps of the prefix lengths of the variants, and
// of the exact variants, stored for s.q's name and family, and sets s.born
// to when their list began.
func (c *Cache) variants(s *scratch, now *time.Time) (normal, exact [entry.ScopesLen]byte, ok bool) {
	s.probe = entry.ScopesKey(s.probe[:0], s.key, s.q.ecs.family)
	ok = c.store.Get(s.probe, c.store.Hash(s.probe), func(e entry.Entry) bool {
		if c.at(now).Unix() > e.Expires()+int64(c.StaleUpTo/time.Second) {
			return false
		}
		e.SetFreq(e.Freq() + 1) // a hit of the list, as Hit counts one for eviction
		l := e.List()
		normal, exact, s.born = *l.Bits(), *l.Exact(), e.Stored()
		return true
	})
	return normal, exact, ok
}

// lookupKey looks key up. Under serve_stale_policy prefer_positive an
// answer, fresh or stale, is looked up before the denials and non-answers
// kept beside it.
// It reports whether f found an entry.
func (c *Cache) lookupKey(s *scratch, key []byte, now *time.Time, withStale bool, f *found) bool {
	if !c.PreferPositive {
		return c.probe(s, key, now, withStale, false, f)
	}
	if c.probe(s, key, now, withStale, true, f) {
		return true
	}
	if f.upgrade {
		// The answer is kept without the DNSSEC records a DO client needs:
		// it misses and upgrades the answer rather than take a denial.
		return false
	}
	key[entry.FlagsAt(key)] |= entry.KeyOther
	defer func() { key[entry.FlagsAt(key)] &^= entry.KeyOther }()
	return c.probe(s, key, now, withStale, false, f)
}

// probe looks up key, answersOnly skipping entries that do not answer, and
// fills f when it finds an entry to serve; f is left alone otherwise.
func (c *Cache) probe(s *scratch, key []byte, at *time.Time, withStale, answersOnly bool, f *found) bool {
	h := c.store.Hash(key)
	return c.store.Get(key, h, func(e entry.Entry) bool {
		return c.serve(s, e, h, at, withStale, answersOnly, f)
	})
}

// serve fills f from e, the entry under the key whose hash is h, and
// reports whether it may serve s.q; it runs with e's shard locked.
func (c *Cache) serve(s *scratch, e entry.Entry, h uint64, at *time.Time, withStale, answersOnly bool, f *found) bool {
	if answersOnly && e.Flags()&entry.FlagAnswers == 0 || e.Stored() < s.born {
		return false
	}
	if !s.q.takes(e) {
		// What serves other clients: the miss refreshes it, a failure leaves it.
		f.upgrade, f.popularity = true, e.Popularity()
		return false
	}
	now := c.at(at)
	age := max(0, now.Unix()-int64(e.Stored()))
	ttl := e.TTL()
	if s.q.do {
		ttl = e.ProofTTL()
	}
	left := int64(ttl) - age
	state := fresh
	switch {
	case left > 0:
	case c.StaleUpTo > 0 && -left < int64(c.StaleUpTo/time.Second):
		state = stale
	default:
		// Past a DO client's proof, e may still serve clients without DO:
		// the miss refreshes it (found.upgrade), a failure leaves it.
		f.upgrade, f.popularity = int64(e.TTL())-age > -int64(c.StaleUpTo/time.Second), e.Popularity()
		return false
	}
	window := int64(c.PrefetchWindow / time.Second)
	f.state, f.kind, f.hash, f.scope, f.dnssec, f.noECS = state, store.KindOf(e), h, e.Scope(), e.HoldsDNSSEC(), e.Flags()&entry.FlagNoECS != 0
	f.prefetch = state == fresh && c.Prefetch > 0 && e.PopularityAfterHit(now.Unix(), window) >= c.Prefetch && left <= c.prefetchThreshold(ttl)
	if !s.alone || state == fresh && !f.prefetch {
		e.Hit(now.Unix(), window)
	}
	if state == stale || f.prefetch {
		f.popularity = e.Popularity() // what the refresh's entry inherits
	}
	if state == fresh || withStale {
		f.reply = s.replies.appendReply(&s.q, e, c.form(age, e, state == stale))
	}
	return true
}

// prefetchThreshold is the TTL left below which a popular entry is fetched
// again: PERCENTAGE of ttl, the TTL left counts down from, rounded up.
func (c *Cache) prefetchThreshold(ttl uint32) int64 {
	return (int64(ttl)*int64(c.PrefetchPercentage) + 99) / 100
}

// form says how e is served from the cache at age seconds: TTLs aged (or
// kept with keepttl, or the serve-stale response TTL), and the Extended DNS
// Error (RFC 8914) of cached failures and stale answers.
func (c *Cache) form(age int64, e entry.Entry, isStale bool) replyForm {
	v := replyForm{age: uint32(age)}
	if c.KeepTTL {
		v.age = 0
	}
	if isStale && (c.StaleTTL > 0 || !c.KeepTTL) {
		v.fixed, v.value = true, uint32(c.StaleTTL/time.Second)
	}
	switch {
	case e.Rcode() == dns.RcodeServerFailure:
		v.ede = edeCachedError // an error, stale or not: no stale data
	case isStale && (e.Rcode() == dns.RcodeNameError || e.Flags()&entry.FlagNXName != 0):
		v.ede = edeStaleNXDomain // a compact denial's too: the name does not exist
	case isStale:
		v.ede = edeStaleAnswer
	}
	return v
}

// write sends reply to the client. Plugins before the cache wrap w and only
// understand WriteMsg, so reply goes out as a *dns.Msg unless setup found
// that none can be in the way. Nested lookups (autopath, dns64, kubernetes
// ExternalName) always get a *dns.Msg: their writers have no Write.
func (c *Cache) write(w dns.ResponseWriter, reply []byte) error {
	if c.plan.raw && !coredns.Nested(w) {
		return rawWrite(w, reply)
	}
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		return err
	}
	// The reply already fits the client; compression keeps it fitting when
	// CoreDNS's ScrubWriter measures it again.
	m.Compress = true
	return w.WriteMsg(m)
}
