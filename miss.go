package compactcache

import (
	"context"
	"errors"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

// miss asks the next plugin with DO=1, so that one entry serves DO and non-DO
// clients, stores the reply when it is cacheable and answers the client from
// what was stored, filtered for it.
func (c *Cache) miss(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, s *scratch, m *serverMetrics) (int, error) {
	up := upstreamRequest(r)
	cw := &captureWriter{ResponseWriter: w, c: c, s: s, req: up, m: m}
	rcode, err := plugin.NextOrFailure(c.Name(), c.Next, ctx, cw, up)
	// The next plugin can fail without writing, as forward does when the
	// upstream times out. Cache the failure for the servfail time so client
	// retries don't all reach the upstream; a canceled request is not an
	// upstream failure.
	if !cw.wrote && err != nil && rcode == dns.RcodeServerFailure && ctx.Err() == nil && c.failttl > 0 {
		fail := new(dns.Msg)
		fail.SetRcode(up, dns.RcodeServerFailure)
		b := builderPool.Get().(*builder)
		c.store1(fail, up, s, b, m)
		builderPool.Put(b)
	}
	return rcode, err
}

// upstreamRequest returns a copy of r with DO set and an EDNS buffer that
// fits signed answers; the plugins before the cache keep seeing r. AD asks
// the upstream to say whether it validated (RFC 6840 5.7).
func upstreamRequest(r *dns.Msg) *dns.Msg {
	up := r.Copy()
	up.AuthenticatedData = true
	o := up.IsEdns0()
	if o == nil {
		up.SetEdns0(upstreamUDPSize, true)
		return up
	}
	o.SetDo()
	if o.UDPSize() < upstreamUDPSize {
		o.SetUDPSize(upstreamUDPSize)
	}
	return up
}

// captureWriter takes the next plugin's reply on a miss.
type captureWriter struct {
	dns.ResponseWriter
	c     *Cache
	s     *scratch
	req   *dns.Msg // the request as it went upstream
	m     *serverMetrics
	wrote bool
}

// WriteMsg stores res when it is cacheable and writes the client's reply.
func (cw *captureWriter) WriteMsg(res *dns.Msg) error {
	cw.wrote = true
	b := builderPool.Get().(*builder)
	defer builderPool.Put(b)
	if e, ok := cw.c.store1(res, cw.req, cw.s, b, cw.m); ok {
		return cw.c.write(cw.ResponseWriter, cw.s.w.appendReply(&cw.s.q, e, ttlView{}))
	}
	return cw.ResponseWriter.WriteMsg(forClient(res, &cw.s.q))
}

// Write passes raw replies on, filtered for the client, without caching:
// only replies the cache can check are stored.
func (cw *captureWriter) Write(b []byte) (int, error) {
	cw.wrote = true
	log.Debug("Not caching a reply written as bytes by the next plugin")
	res := new(dns.Msg)
	if err := res.Unpack(b); err != nil {
		cw.m.drops.Inc()
		return cw.ResponseWriter.Write(b)
	}
	return len(b), cw.ResponseWriter.WriteMsg(forClient(res, &cw.s.q))
}

// store1 stores res, the reply to req, when it is cacheable. It returns the
// entry as b built it, for the client's reply to be written from.
func (c *Cache) store1(res, req *dns.Msg, s *scratch, b *builder, m *serverMetrics) (entry, bool) {
	now := c.now()
	v := c.classify(res, req, now)
	if !v.store {
		if v.why != "" {
			m.drops.Inc()
			log.Debugf("Not caching reply for %q/%d: %s", req.Question[0].Name, req.Question[0].Qtype, v.why)
		}
		return nil, false
	}
	e, err := b.build(res, s.key, uint32(now.Unix()), uint32(v.ttl/time.Second), entryFlags(res, v.kind), c.maxEntry)
	if err != nil {
		if errors.Is(err, errEntryTooLarge) {
			m.refused.Inc()
		} else {
			m.drops.Inc()
		}
		log.Debugf("Not caching reply for %q/%d: %s", req.Question[0].Name, req.Question[0].Qtype, err)
		return nil, false
	}
	m.stored(c.store, c.store.put(e, now.Unix()))
	return e, true
}

func entryFlags(m *dns.Msg, kind int) uint16 {
	f := uint16(m.Rcode) & flagRcodeMask
	if m.Authoritative {
		f |= flagAA
	}
	if m.RecursionAvailable {
		f |= flagRA
	}
	if m.AuthenticatedData {
		f |= flagAD
	}
	if kind == kindDenial {
		f |= flagDenial
	}
	return f
}

// forClient tailors a reply that was not cached to the client that asked:
// the DNSSEC records and the DO and AD bits it did not ask for go, and OPT
// goes when its request had none.
func forClient(res *dns.Msg, q *query) *dns.Msg {
	m := *res
	if !q.do && !q.ad {
		m.AuthenticatedData = false
	}
	keep := func(rr dns.RR) bool {
		t := rr.Header().Rrtype
		if t == dns.TypeOPT {
			return q.edns
		}
		return q.do || !isDNSSEC(t) || t == q.qtype
	}
	m.Answer = filterRRs(res.Answer, keep)
	m.Ns = filterRRs(res.Ns, keep)
	m.Extra = filterRRs(res.Extra, keep)
	if o := m.IsEdns0(); o != nil && !q.do {
		o = dns.Copy(o).(*dns.OPT)
		o.Hdr.Ttl &^= 1 << 15 // DO
		for i, rr := range m.Extra {
			if rr.Header().Rrtype == dns.TypeOPT {
				m.Extra[i] = o
			}
		}
	}
	return &m
}

func filterRRs(rrs []dns.RR, keep func(dns.RR) bool) []dns.RR {
	out := make([]dns.RR, 0, len(rrs))
	for _, rr := range rrs {
		if keep(rr) {
			out = append(out, rr)
		}
	}
	return out
}
