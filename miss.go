package compactcache

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

// miss asks the next plugin, stores the reply when it is cacheable and
// answers the client: from the stored entry, so that hits and misses are
// written alike, or with the reply itself tailored to the client.
func (c *Cache) miss(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, s *scratch, m *serverMetrics) (int, error) {
	b := builderPool.Get().(*builder)
	defer builderPool.Put(b)
	cw, rcode, err := c.fetch(ctx, w, r, s, b, m)
	if cw.reply == nil {
		return rcode, err
	}
	if cw.entry != nil {
		return rcode, c.write(w, s.w.appendReply(&s.q, cw.entry, c.view(0, cw.entry)))
	}
	return rcode, w.WriteMsg(forClient(cw.reply, &s.q))
}

// fetch asks the next plugin for r's question with DO=1, so that one entry
// serves DO and non-DO clients, and stores the reply when it is cacheable.
// w is what the next plugin sees of the client; nothing is written to it.
func (c *Cache) fetch(ctx context.Context, w dns.ResponseWriter, r *dns.Msg, s *scratch, b *builder, m *serverMetrics) (*captureWriter, int, error) {
	up := upstreamRequest(r)
	cw := &captureWriter{ResponseWriter: w, c: c, s: s, b: b, req: up, m: m, udp: isUDP(w)}
	rcode, err := plugin.NextOrFailure(c.Name(), c.Next, ctx, cw, up)
	if cw.reply != nil && cw.reply.Truncated && cw.udp {
		// The answer did not fit the upstream's UDP reply. Ask again over
		// TCP: forward, like most plugins, picks the client's transport.
		truncated := cw.reply
		cw.ResponseWriter, cw.udp, cw.reply = tcpWriter{w}, false, nil
		rcode, err = plugin.NextOrFailure(c.Name(), c.Next, ctx, cw, up)
		if cw.reply == nil {
			cw.reply = truncated
		}
	}
	// The next plugin can fail without writing, as forward does when the
	// upstream times out. Cache the failure for the servfail time so client
	// retries don't all reach the upstream; a canceled request is not an
	// upstream failure.
	if cw.reply == nil && err != nil && rcode == dns.RcodeServerFailure && ctx.Err() == nil && c.failttl > 0 {
		fail := new(dns.Msg)
		fail.SetRcode(up, dns.RcodeServerFailure)
		c.store1(fail, up, s, b, m)
	}
	return cw, rcode, err
}

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

// captureWriter takes the next plugin's reply and stores it; the caller
// decides what the client gets.
type captureWriter struct {
	dns.ResponseWriter
	c     *Cache
	s     *scratch
	b     *builder
	req   *dns.Msg // the request as it went upstream
	m     *serverMetrics
	udp   bool // a truncated reply will be asked again over TCP
	reply *dns.Msg
	entry entry // built in b from reply, when stored
}

// WriteMsg implements dns.ResponseWriter.
func (cw *captureWriter) WriteMsg(res *dns.Msg) error {
	cw.reply, cw.entry = res, nil
	if res.Truncated && cw.udp {
		return nil
	}
	cw.entry, _ = cw.c.store1(res, cw.req, cw.s, cw.b, cw.m)
	return nil
}

// Write takes a reply written as bytes. It is passed on but not cached: only
// replies the cache can check are stored.
func (cw *captureWriter) Write(b []byte) (int, error) {
	res := new(dns.Msg)
	if err := res.Unpack(b); err != nil {
		cw.m.drops.Inc()
		return 0, err
	}
	log.Debug("Not caching a reply written as bytes by the next plugin")
	cw.reply, cw.entry = res, nil
	return len(b), nil
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
