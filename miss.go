package compactcache

import (
	"cmp"
	"context"
	"errors"
	"math"
	"net"
	"time"

	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flights"
	"github.com/compactcache/compactcache/internal/reply"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
	ot "github.com/opentracing/opentracing-go"
)

// miss asks the next plugin, stores the reply when it is cacheable and
// answers the client: from the stored entry, so that hits and misses are
// written alike, or with the reply itself tailored to the client. Misses for
// one question that arrive while it is asked wait for that answer instead of
// asking again. prior is what the lookup found: an entry to upgrade, or
// none.
func (c *Cache) miss(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, s *scratch, prior *found, m *cachemetrics.Server) (int, error) {
	k := fetchPool.Get().(*fetch)
	f, leader, landed := c.flights.Join(c.flightKey(s), s.q.do, &k.flight)
	if !leader {
		fetchPool.Put(k) // untouched: join wrote nothing to it
		return c.await(ctx, w, r, s, f, m)
	}
	// Land the flight even if the next plugin panics (the server recovers),
	// so that no waiter is left waiting: deferred before anything that can
	// panic. The pooled fetch's writer holds no reply until capture.
	cw := &k.cw
	rcode, err := dns.RcodeServerFailure, errNoReply
	defer func() {
		if cw.reply == nil && ctx.Err() != nil {
			err = errGone // cut short for this request alone
		}
		if !c.flights.Land(f, cw.reply, rcode, err) {
			// Nobody joined the flight, and nobody can now that it has
			// landed: the fetch is this request's alone. Cleared, so that
			// the pool keeps no request or reply alive.
			*k = fetch{}
			fetchPool.Put(k)
		}
	}()
	if landed {
		// A flight for this question may have landed since the lookup:
		// what it stored answers this request as it would have answered
		// a waiter of it. The flight lands without a reply: its waiters
		// find the entry stored (await).
		if found := c.lookup(s, time.Time{}, false); found.state == fresh {
			rcode, err = dns.RcodeSuccess, errStored
			return dns.RcodeSuccess, c.write(w, found.reply)
		}
	}
	k.capture(c, w, r, s, m)
	if c.shared != nil {
		if found := c.fromShared(ctx, r, s, cw.gen, m); found.state != absent {
			rcode, err = dns.RcodeSuccess, errStored
			return dns.RcodeSuccess, c.write(w, found.reply)
		}
	}
	if prior.upgrade {
		// The entry the client could not take still serves clients without
		// DO: only what may refresh it replaces it, a failure does not.
		cw.refresh, cw.popularity = true, prior.popularity
	}
	rcode, err = cw.fetch(ctx)
	if cw.reply == nil {
		return rcode, err
	}
	return c.answer(w, r, cw, rcode, err)
}

// errNoReply is the error of a fetch that ended without a reply or error.
var errNoReply = errors.New("no reply from the next plugin")

// errStored lands the flight of a miss answered from an entry in the store,
// the shared tier's or an earlier flight's: the waiters read it from there.
var errStored = errors.New("answered from an entry stored")

// errGone lands the flight of a miss whose client went away: waiters ask anew.
var errGone = errors.New("the leading request was canceled")

// await answers a miss that waited for another request's fetch of the same
// question: from the cache when the reply was stored, else with the reply.
func (c *Cache) await(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, s *scratch, f *flights.Flight, m *cachemetrics.Server) (int, error) {
	select {
	case <-f.Done:
	case <-ctx.Done():
		return dns.RcodeServerFailure, ctx.Err()
	}
	if found := c.lookup(s, time.Time{}, true); found.state != absent {
		// Not the leader's rcode: SERVFAIL of a failed fetch, stored for
		// the servfail time, would have the server write a second reply.
		if found.state == stale {
			m.Stale.Inc()
		}
		return dns.RcodeSuccess, c.write(w, found.reply)
	}
	if f.Reply == nil {
		if f.Err == errStored || f.Err == errGone {
			// The leader answered from an entry in the store, gone
			// already, or went away: ask for it anew.
			return c.miss(ctx, w, r, s, &found{}, m)
		}
		return f.Rcode, f.Err
	}
	// The reply answers the leader's request; passOn writes it with this
	// one's ID and question.
	return dns.RcodeSuccess, c.passOn(w, r, f.Reply, s, nil) // counted by the leader
}

// flightKey names what a miss asks upstream: the question and key flags, and
// the client subnet sent.
func (c *Cache) flightKey(s *scratch) uint64 {
	if e := &s.q.ecs; e.family != 0 {
		s.probe = entry.VariantKey(s.probe[:0], s.key, 0, e.family, e.sent, e.addr)
		return c.store.Hash(s.probe)
	}
	return c.store.Hash(s.key)
}

// answer writes the reply cw fetched for r to the client, and returns the
// next plugin's error and rcode, as the stock cache does, but for a rcode
// that would have the server write a second reply (plugin.ClientWrite).
func (c *Cache) answer(w dns.ResponseWriter, r *dns.Msg, cw *captureWriter, rcode int, err error) (int, error) {
	if !plugin.ClientWrite(rcode) {
		rcode = dns.RcodeSuccess
	}
	if cw.entry != nil {
		// Fresh from upstream: no Extended DNS Error of a cached one.
		return rcode, cmp.Or(err, c.write(w, cw.s.replies.appendReply(&cw.s.q, cw.entry, cw.form)))
	}
	if cw.dropped {
		return rcode, cmp.Or(err, c.passOn(w, r, cw.reply, cw.s, nil))
	}
	return rcode, cmp.Or(err, c.passOn(w, r, cw.reply, cw.s, cw.m))
}

// captureWriter asks the next plugin on behalf of the cache and takes its
// reply, storing it when it is cacheable; the caller decides what the client
// gets.
type captureWriter struct {
	dns.ResponseWriter // what the next plugin sees of the client
	c                  *Cache
	s                  *scratch
	b                  *entry.Builder // s.builder()
	req                *dns.Msg       // the request as it goes upstream
	m                  *cachemetrics.Server

	udp        bool // a truncated reply will be asked again over TCP
	refresh    bool // only replies that refresh an entry are stored
	popularity int  // what the stored entry inherits
	dnssec     bool // the entry keeps the DNSSEC records: for a DO client, or refreshing an entry that holds them

	gen uint64 // the cache's flush generation when the fetch began (admin)

	reply   *dns.Msg
	entry   entry.Entry // built in b from reply, when stored, or when too large to store and passed on
	form    replyForm   // how entry is written: as stored, or as a reply passed on
	fresh   bool        // reply may refresh an entry (refreshed)
	dropped bool        // reply is counted in drops (or refused): passOn does not count it again
}

// fetch is what asking the next plugin takes, in one allocation, since the
// miss path's share of an insert is counted in allocations: the writer that
// captures the reply, the request it sends upstream, and on the miss path the
// flight that other misses for the question wait on (they keep the fetch
// alive until they have read it; one nobody waited on goes back to fetchPool).
type fetch struct {
	cw     captureWriter
	up     upstreamMsg
	flight flights.Flight
}

// newCapture returns the writer that fetches r for the cache, outside the
// miss path.
func (c *Cache) newCapture(w dns.ResponseWriter, r *dns.Msg, s *scratch, m *cachemetrics.Server) *captureWriter {
	return new(fetch).capture(c, w, r, s, m)
}

// capture readies k's writer to fetch r for the cache, and returns it.
func (k *fetch) capture(c *Cache, w dns.ResponseWriter, r *dns.Msg, s *scratch, m *cachemetrics.Server) *captureWriter {
	k.cw = captureWriter{ResponseWriter: w, c: c, s: s, b: s.builder(), m: m, udp: isUDP(w), dnssec: s.q.do, gen: c.fence.Gen()}
	k.cw.req = k.up.set(r, &s.q.ecs)
	return &k.cw
}

// fetch asks the next plugin for the question with DO=1, whatever the
// client's DO, so that an entry stored for a client without DO is what a DO
// client's entry is without its DNSSEC records: the same rcode and records
// (an upstream that signs on the fly answers a name that does not exist
// with NODATA to DO queries only, and a compact denial is restored to
// NXDOMAIN from its NSEC), the same AD, and a reply that tells whether the
// name is signed at all, so that an entry of an unsigned name serves DO
// clients at once. The signatures travel from the upstream, but are not
// stored for clients that never receive them (Builder.Build).
func (cw *captureWriter) fetch(ctx context.Context) (int, error) {
	c := cw.c
	rcode, err := cw.ask(ctx)
	if cw.reply != nil && cw.reply.Truncated && cw.udp {
		// The answer did not fit the upstream's UDP reply. Ask again over
		// TCP: forward, like most plugins, picks the client's transport.
		truncated := cw.reply
		cw.ResponseWriter, cw.udp, cw.reply = tcpWriter{cw.ResponseWriter}, false, nil
		rcode, err = cw.ask(ctx)
		if cw.reply == nil {
			cw.reply = truncated
		}
	}
	// The next plugin can fail without writing, as forward does when the
	// upstream times out. Cache the failure for the servfail time so client
	// retries don't all reach the upstream; a canceled request is not an
	// upstream failure, and a failed refresh keeps the entry it refreshes.
	if cw.reply == nil && err != nil && rcode == dns.RcodeServerFailure && ctx.Err() == nil && c.ServfailTTL > 0 && !cw.refresh {
		fail := new(dns.Msg)
		fail.SetRcode(cw.req, dns.RcodeServerFailure)
		cw.store(fail)
	}
	return rcode, err
}

// ask sends cw.req to the next plugin, with cw as its writer. It is
// plugin.NextOrFailure, tracing span included, without the writer that
// NextOrFailure wraps around cw to tell a plugin.PluginTracker which plugin
// wrote the reply: it tells only a tracker directly inside it, and cw is
// none, so that wrapper never told anything. It was the miss path's one
// allocation.
func (cw *captureWriter) ask(ctx context.Context) (int, error) {
	c := cw.c
	if c.Next == nil {
		return plugin.NextOrFailure(c.Name(), nil, ctx, cw, cw.req)
	}
	if span := ot.SpanFromContext(ctx); span != nil {
		child := span.Tracer().StartSpan(c.Next.Name(), ot.ChildOf(span.Context()))
		defer child.Finish()
		ctx = ot.ContextWithSpan(ctx, child)
	}
	return c.Next.ServeDNS(ctx, cw, cw.req)
}

// refreshed reports whether the fetch brought what may replace a stale or
// expiring entry (RFC 8767 section 4: NOERROR or NXDOMAIN; under the
// prefer_positive policy only an answer), stored or passed on: as in the stock
// cache, a valid reply the cache cannot keep is no failure to recheck.
func (cw *captureWriter) refreshed() bool { return cw.reply != nil && cw.fresh }

func isUDP(w dns.ResponseWriter) bool {
	_, ok := w.RemoteAddr().(*net.UDPAddr)
	return ok
}

// tcpWriter presents a UDP client as a TCP one to the next plugin.
type tcpWriter struct{ dns.ResponseWriter }

func (w tcpWriter) RemoteAddr() net.Addr {
	a := w.ResponseWriter.RemoteAddr().(*net.UDPAddr)
	return &net.TCPAddr{IP: a.IP, Port: a.Port, Zone: a.Zone}
}

// upstreamMsg is the request as it goes upstream, with room for the parts
// that differ from the client's request.
type upstreamMsg struct {
	msg   dns.Msg
	opt   dns.OPT
	extra [1]dns.RR // the additional section as most requests have it: the OPT
}

// set makes u r as it goes upstream, and returns it: with DO set and an EDNS
// buffer that fits signed answers, AD, which asks the upstream to say whether
// it validated (RFC 6840 5.7), the client subnet cut to the configured source
// prefix, without the client's TSIG; the plugins before the cache keep seeing
// r. The copy is shallow but for the additional section and its OPT, the only
// parts that change: copying whole requests costs a miss more than its work.
func (u *upstreamMsg) set(r *dns.Msg, ecs *subnet) *dns.Msg {
	u.msg = *r
	u.msg.AuthenticatedData = true
	u.msg.Extra = u.extra[:0] // append moves it to the heap past len(u.extra)
	var opt *dns.OPT
	for _, rr := range r.Extra {
		if rr.Header().Rrtype == dns.TypeTSIG {
			// The client's signature covers the message as it sent it,
			// which this one is not, and must be last (RFC 8945 5.1),
			// where the OPT goes: the upstream would answer FORMERR.
			continue
		}
		if o, ok := rr.(*dns.OPT); ok && opt == nil {
			u.opt = dns.OPT{Hdr: o.Hdr, Option: o.Option}
			opt = &u.opt
			rr = opt
		}
		u.msg.Extra = append(u.msg.Extra, rr)
	}
	if opt == nil {
		u.opt = dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		opt = &u.opt
		u.msg.Extra = append(u.msg.Extra, opt)
	}
	opt.SetDo()
	opt.SetUDPSize(max(opt.UDPSize(), upstreamUDPSize))
	if ecs.family != 0 {
		dnsmsg.SetSubnet(opt, ecs.option(ecs.sent))
	}
	return &u.msg
}

// WriteMsg implements dns.ResponseWriter.
func (cw *captureWriter) WriteMsg(res *dns.Msg) error {
	cw.reply, cw.entry, cw.fresh, cw.dropped = res, nil, false, false
	if res.Truncated && cw.udp {
		return nil
	}
	cw.store(res)
	return nil
}

// Write takes a reply written as bytes. It is passed on but not cached: only
// replies the cache can check are stored.
func (cw *captureWriter) Write(b []byte) (int, error) {
	res := new(dns.Msg)
	if err := res.Unpack(b); err != nil {
		cw.drop()
		log.Debugf("Not caching a reply written as bytes that do not unpack: %s", err)
		return 0, err
	}
	log.Debug("Not caching a reply written as bytes by the next plugin")
	cw.reply, cw.entry, cw.fresh, cw.dropped = res, nil, false, false
	return len(b), nil
}

// drop counts the reply in drops_total.
func (cw *captureWriter) drop() { cw.m.Drops.Inc(); cw.dropped = true }

// store stores res when it is cacheable and sets cw.entry to the entry the
// client's reply is written from, as cw.b built it: stored, or too large to.
func (cw *captureWriter) store(res *dns.Msg) {
	c, now, q := cw.c, cw.c.now(), cw.req.Question[0]
	v := c.classify(res, cw.req, now)
	cw.fresh = v.answers || !c.PreferPositive && !v.bad && !v.erred && (res.Rcode == dns.RcodeSuccess || res.Rcode == dns.RcodeNameError)
	switch {
	case !v.store:
		if v.bad {
			cw.drop()
		}
		log.Debugf("Not caching reply for %q/%s: %s", q.Name, dns.Type(q.Qtype), v.why)
		return
	case c.disabled(v.kind, q.Name):
		return
	case !entry.Probed(q.Qtype, q.Qclass):
		return // it would outlive every flush of its name
	case cw.refresh && !c.PreferPositive && res.Rcode != dns.RcodeSuccess && res.Rcode != dns.RcodeNameError:
		return // a failed refresh leaves the entry it would replace (RFC 8767 4)
	}
	key, variant, ok := storeKey(cw.b, cw.s.key, &cw.s.q, res)
	if !ok {
		cw.fresh = false
		cw.drop()
		log.Debugf("Not caching reply for %q/%s: its ECS option does not echo the query's", q.Name, dns.Type(q.Qtype))
		return
	}
	flags := entryFlags(res, v)
	if cw.dnssec {
		flags |= entry.FlagDNSSEC
	}
	if variant {
		flags |= entry.FlagVariant
	}
	if cw.s.q.ecs.family == 0 {
		flags |= entry.FlagNoECS
	}
	// Under prefer_positive, what does not answer is kept beside the answer
	// it would otherwise replace; an answer replaces both.
	if c.PreferPositive && flags&entry.FlagAnswers == 0 {
		key = cw.b.OtherKey(key)
	}
	// The slot and ghost bucket that the put reads first load while the
	// entry is built.
	c.store.Prefetch(c.store.Hash(key))
	e, err := cw.b.Build(res, key, q.Name, uint32(now.Unix()), uint32(v.ttl/time.Second), uint32(v.floor/time.Second), flags, c.MaxEntry)
	if err != nil {
		cw.dropped = true // counted in refused or drops
		if errors.Is(err, entry.ErrTooLarge) {
			cw.m.TooLarge.Inc()
			cw.entry, _ = passedEntry(cw.s, cw.req, res) // the client's reply (answer); one that cannot be built refreshes nothing: the stale entry serves
			cw.form = replyForm{passed: true, rcode: uint16(res.Rcode), tc: res.Truncated}
		} else {
			cw.m.Drops.Inc()
		}
		cw.fresh = cw.fresh && cw.entry != nil
		log.Debugf("Not caching reply for %q/%s: %s", q.Name, dns.Type(q.Qtype), err)
		return
	}
	e.SetPopularity(cw.popularity)
	// Not when a flush that began since the fetch did covers it: its answer
	// may be what the flush dropped (flush.go).
	// A variant is listed before a flush may begin: the flush finds the
	// name's variants through the list.
	stored := false
	c.fence.Store(cw.gen, e, func() {
		var d store.Displaced
		d, stored = c.put(e, now.Unix())
		cw.m.Evicted(d)
		if stored && variant {
			c.recordVariant(cw.b, cw.s, e, now.Unix(), cw.m)
		}
	})
	if !stored {
		return
	}
	if c.shared != nil {
		c.shared.Put(e)
	}
	if c.PreferPositive && flags&entry.FlagAnswers != 0 {
		c.store.Remove(cw.b.OtherKey(e.Key())) // not key: a variant's is in the buffer recordVariant reused
	}
	cw.entry, cw.form = e, replyForm{}
}

// put stores e, a fetched entry. One without the DNSSEC records does not
// replace a live one of its key that has them: a fetch for a client without
// DO that lands after a DO client's fetch of the same name would undo the
// upgrade, and the next DO client would fetch again. The entry kept serves
// both kinds of client. It reports whether e was stored.
func (c *Cache) put(e entry.Entry, now int64) (d store.Displaced, stored bool) {
	if e.HoldsDNSSEC() {
		return c.store.Put(e, now), true
	}
	d = c.store.Update(e.Key(), now, func(old entry.Entry) entry.Entry {
		if old != nil && old.HoldsDNSSEC() && now <= old.Expires() {
			return nil
		}
		stored = true
		return e
	})
	return d, stored
}

// recordVariant adds the ECS variant e of s.q's name to the name's list,
// dropping the oldest past max_variants.
func (c *Cache) recordVariant(b *entry.Builder, s *scratch, e entry.Entry, now int64, m *cachemetrics.Server) {
	family, v := s.q.ecs.family, entry.VariantOf(e)
	var dropped []byte
	key := entry.ScopesKey(b.Key[:0], s.key, family)
	m.Evicted(c.store.Update(key, now, func(old entry.Entry) entry.Entry {
		list, d := entry.ListVariant(b, old, s.key, family, v, c.ecs.MaxVariants, e.Stored(), e.TTL())
		dropped = d
		return list
	}))
	if dropped != nil {
		c.store.Remove(dropped)
		if c.PreferPositive {
			// What does not answer is kept beside the answer (store):
			// listed nowhere once its variant leaves the list, it would
			// outlive max_variants and every flush of the name.
			c.store.Remove(b.OtherKey(dropped))
		}
	}
}

// disabled reports whether `disable` keeps kind for name out of the cache.
func (c *Cache) disabled(kind int, name string) bool {
	except := c.DisableSuccess
	if kind == store.KindDenial {
		except = c.DisableDenial
	}
	return len(except) > 0 && plugin.Zones(except).Matches(name) != ""
}

// passOn writes res, a reply to r that the cache did not store, to the
// client as the cache's own replies are written: from an entry built for it
// alone and not stored, through the reply writer (wire.go), so that what a
// client sees of a reply (DNSSEC records, AD, the compact denial's NXDOMAIN,
// OPT, ECS, size) has one writer, at the cost of packing res's records once.
// A reply to another question, one whose ECS does not echo the query's
// (RFC 7871 7.3: dropped), or one the entry format cannot hold (rdata that
// does not pack), becomes SERVFAIL, as Unbound answers the first and the
// last, counted in m's drops unless m is nil.
func (c *Cache) passOn(w dns.ResponseWriter, r, res *dns.Msg, s *scratch, m *cachemetrics.Server) error {
	e, err := passedEntry(s, r, res)
	if err != nil {
		if m != nil {
			m.Drops.Inc()
		}
		log.Debugf("Answering SERVFAIL in place of a reply for %q/%s: %s", r.Question[0].Name, dns.Type(r.Question[0].Qtype), err)
		return c.write(w, s.replies.appendReply(&s.q, servfailEntry(s), replyForm{}))
	}
	return c.write(w, s.replies.appendReply(&s.q, e, replyForm{passed: true, rcode: uint16(res.Rcode), tc: res.Truncated}))
}

// passedEntry builds, in s's builder, the entry passOn writes res from:
// with its DNSSEC records, which the writer gives DO clients only, and an
// entry TTL no record reaches, so that at age 0 each record keeps its own.
func passedEntry(s *scratch, r, res *dns.Msg) (entry.Entry, error) {
	if !reply.SameQuestion(res, r) {
		return nil, errForeign
	}
	b := s.builder()
	// Stored, the reply would have this key: its ECS scope is echoed.
	key, _, ok := storeKey(b, s.key, &s.q, res)
	if !ok {
		return nil, errors.New("its ECS option does not echo the query's")
	}
	flags := entryFlags(res, verdict{nxname: reply.CompactNXDomain(res)}) | entry.FlagDNSSEC
	return b.Build(res, key, "", 0, math.MaxUint32, 0, flags, entry.MaxLen)
}

// errForeign is why a reply that answers another question is not passed on.
var errForeign = errors.New("its question does not match the request")

// servfailEntry returns an entry of SERVFAIL for s's question, built in s's
// builder.
func servfailEntry(s *scratch) entry.Entry {
	fail := &dns.Msg{MsgHdr: dns.MsgHdr{Response: true, Rcode: dns.RcodeServerFailure}}
	e, err := s.builder().Build(fail, s.key, "", 0, math.MaxUint32, 0, entryFlags(fail, verdict{}), entry.MaxLen)
	if err != nil {
		// A message without records always builds.
		panic(err)
	}
	return e
}
