package compactcache

import (
	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/bufsize"
)

// plan is what the other plugins of a block ask of the cache, read off its
// chain once, when the block starts.
type plan struct {
	// raw: hits reach the client as bytes through w.Write (raw.go): every
	// plugin before the cache is a rawWriter, prometheus, or loadbalance
	// with round_robin.
	raw bool
	// rotate: loadbalance's round_robin comes before the cache; the reply
	// writer applies its order to the replies that go around it: those of
	// the front end, and those written raw.
	rotate bool
	// chain: a plugin before the cache reorders replies in a way only it
	// can (loadbalance's weighted policy, prefer): the front end hands
	// every request to the chain.
	chain bool
	// nsid: nsid, before the cache, adds NSID: the front end leaves it to the chain.
	nsid bool
	// bufsize: the EDNS buffer size bufsize clamps requests to before the
	// cache, 0 for none.
	bufsize uint16
	// stock: the stock cache is in the block too.
	stock bool
	// bypass: the zones authoritative plugins of the block serve
	// themselves, never from a cache (the stock cache's ZoneBypasser).
	bypass dnsmsg.ZoneSet
}

// ZoneBypasser is the stock cache's interface for plugins whose zones must
// always be answered by them, never from the cache.
type ZoneBypasser interface {
	CacheBypassZones() []string
}

// planOf reads the plan of a block whose chain is handlers.
func planOf(handlers []plugin.Handler) plan {
	p := plan{raw: true}
	before := true // the handler comes before the cache
	for _, h := range handlers {
		name := h.Name()
		if b, ok := h.(ZoneBypasser); ok {
			p.bypass = append(p.bypass, dnsmsg.NewZoneSet(b.CacheBypassZones())...)
		}
		switch {
		case name == "cache":
			p.stock = true
		case name == pluginName:
			before = false
		case !before:
		case name == "bufsize":
			if b, ok := h.(bufsize.Bufsize); ok {
				p.bufsize = uint16(min(b.Size, 0xFFFF))
			}
		case name == "nsid":
			p.nsid, p.raw = true, false
		case name == "loadbalance" && coredns.RoundRobin(h):
			p.rotate = true
		case name == "loadbalance":
			p.chain, p.raw = true, false
		case !rawWriters[name] && name != "prometheus":
			p.raw = false
		}
	}
	return p
}
