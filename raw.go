package compactcache

import (
	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/loadbalance"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"
)

// A hit goes to the client as a *dns.Msg built from the reply bytes, since
// the plugins before the cache wrap the ResponseWriter and read what
// WriteMsg is given, unless every plugin of the block is one whose writer
// the cache can satisfy with the bytes themselves (rawPlan); unpacking and
// packing the reply again is most of what a hit costs in plugin mode.

// rawWriters are the plugins that neither wrap the ResponseWriter to read
// or change replies nor make nested lookups through the chain.
var rawWriters = map[string]bool{
	pluginName: true,
	"acl":      true,
	"any":      true,
	"bufsize":  true,
	"cancel":   true,
	"chaos":    true,
	"errors":   true,
	"forward":  true,
	"hosts":    true,
	"local":    true,
	"loop":     true,
	"metadata": true,
	"whoami":   true,
}

// rawPlan is how hits go out as bytes in a block: raw at all, and with the
// records rotated as the block's loadbalance would (round_robin).
type rawPlan struct {
	raw    bool
	rotate bool
}

// rawPlanOf returns the plan of a block of handlers. The plugins before
// the cache, whose writers a reply goes through, must be rawWriters or
// plugins whose writers the cache satisfies itself: prometheus, whose
// recorder it gives the rcode (rawWrite), and loadbalance's round_robin,
// whose order the reply writer applies (replyBuffers.rotation) and whose
// Write, which logs a warning and shuffles nothing, it goes around. The
// plugins after the cache write to the cache, not to the client; their
// nested lookups reach it with a writer of their own (coredns.Nested).
func rawPlanOf(handlers []plugin.Handler) rawPlan {
	p := rawPlan{raw: true}
	for _, h := range handlers {
		if h.Name() == pluginName {
			return p
		}
		switch {
		case rawWriters[h.Name()], h.Name() == "prometheus":
		case h.Name() == "loadbalance" && coredns.RoundRobin(h):
			p.rotate = true
		default:
			return rawPlan{}
		}
	}
	return p
}

// rawWrite writes reply, a hit's bytes, to w, a writer of a block whose
// plan is raw: it gives the metrics recorders on the way the reply's rcode,
// which their Write does not learn, and writes below loadbalance's writer.
func rawWrite(w dns.ResponseWriter, reply []byte) error {
	rcode := int(reply[3] & 0xF)
	target := w
	for cur := w; cur != nil; {
		switch t := cur.(type) {
		case *metrics.Recorder:
			t.Rcode = rcode
			cur = t.ResponseWriter
		case *loadbalance.LoadBalanceResponseWriter:
			target, cur = t.ResponseWriter, t.ResponseWriter
		case *request.ScrubWriter:
			cur = t.ResponseWriter
		default:
			inner, ok := coredns.Unwrap(cur)
			if !ok {
				cur = nil
				break
			}
			cur = inner
		}
	}
	_, err := target.Write(reply)
	return err
}
