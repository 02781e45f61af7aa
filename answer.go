package compactcache

import (
	"net/netip"
	"time"

	"github.com/compactcache/compactcache/internal/frontend"
)

// The cache as the front end sees it (frontend.Cache): requests answered
// from the packet by the same lookup and reply writer as the plugin's hits,
// and counted in the same series.

// frontCache is c behind the front end's interface, which the plugin's own
// API does not show.
type frontCache struct{ c *Cache }

func (fc frontCache) Now() time.Time { return fc.c.now() }

func (fc frontCache) Counters(server string) frontend.Counters { return fc.c.metrics.frontend(server) }

func (fc frontCache) Answerer(server string) frontend.Answerer {
	return &packetAnswerer{c: fc.c, s: scratchPool.New().(*scratch), m: fc.c.metrics.of(server)}
}

// packetAnswerer answers request packets of one server from the cache, in
// a scratch of its own, which holds the reply until the next request.
type packetAnswerer struct {
	c *Cache
	s *scratch
	m *serverMetrics
}

// Answer implements frontend.Answerer: a fresh hit the cache answers alone.
// Prefetches and stale entries need the request as a *dns.Msg for their
// refreshes: the chain serves them.
func (a *packetAnswerer) Answer(pkt []byte, client netip.Addr, tcp bool, now time.Time, hit *frontend.Hit) []byte {
	c, s := a.c, a.s
	if !s.readPacket(pkt, client, tcp, &c.ecs) || !c.serves(s.key) {
		return nil
	}
	f := c.lookup(s, now, false)
	if f.state != fresh || f.prefetch {
		return nil
	}
	a.m.requests.Inc()
	a.m.hits[f.kind].Inc()
	hit.DO, hit.UDPSize = s.q.do, s.q.udpSize
	return f.reply
}
