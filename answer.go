package compactcache

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/frontend"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/coredns/plugin/pkg/response"
	"github.com/miekg/dns"
)

// The cache as the front end sees it (frontend.Cache): requests answered
// from the packet by the same lookup and reply writer as the plugin's hits,
// and counted in the same series.

// frontCache is c behind the front end's interface, which the plugin's own
// API does not show.
type frontCache struct{ c *Cache }

func (fc frontCache) Counters(server string) frontend.Counters { return fc.c.metrics.Frontend(server) }

func (fc frontCache) Answerer(server string) frontend.Answerer {
	s := scratchPool.New().(*scratch)
	s.alone = true
	return &packetAnswerer{c: fc.c, s: s, m: fc.c.metrics.Server(server)}
}

// packetAnswerer answers request packets of one server from the cache, in
// a scratch of its own, which holds the reply until the next request.
type packetAnswerer struct {
	c *Cache
	s *scratch
	m *cachemetrics.Server
}

// Answer implements frontend.Answerer: a fresh hit the cache answers alone.
// Prefetches and stale entries need the request as a *dns.Msg for their
// refreshes: the chain serves them.
func (a *packetAnswerer) Answer(pkt []byte, client netip.Addr, tcp bool, now time.Time, hit *frontend.Hit) []byte {
	c, s := a.c, a.s
	if c.plan.chain || !s.readPacket(pkt, client, tcp, &c.ecs) || s.q.nsid && c.plan.nsid || !c.serves(s.key) {
		return nil
	}
	s.q.rotate = c.plan.rotate
	if b := c.plan.bufsize; b != 0 && s.q.edns && s.q.udpSize > b {
		// bufsize clamps the request before the cache in plugin mode.
		s.q.udpSize = b
		if !tcp {
			s.q.limit = max(dns.MinMsgSize, int(b))
		}
	}
	f := c.lookup(s, now, false)
	if f.state != fresh || f.prefetch {
		return nil
	}
	a.m.Requests.Inc()
	a.m.Hits[f.kind].Inc()
	hit.DO, hit.UDPSize, hit.Class = s.q.do, s.q.udpSize, classOf(f.reply, f.kind)
	return f.reply
}

// classOf is the class the log plugin's filter gives reply, of an entry of
// kind (response.Classify of response.Typify): errors, denials (NXDOMAIN,
// and NODATA, an entry of the denial kind), successes.
func classOf(reply []byte, kind int) response.Class {
	switch rcode := int(binary.BigEndian.Uint16(reply[dnsmsg.OffFlags:]) & 0xF); {
	case rcode == dns.RcodeNameError:
		return response.Denial
	case rcode != dns.RcodeSuccess:
		return response.Error
	case kind == store.KindDenial:
		return response.Denial
	}
	return response.Success
}
