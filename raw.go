package compactcache

import (
	"github.com/compactcache/compactcache/internal/coredns"
	"github.com/coredns/coredns/plugin/loadbalance"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/miekg/dns"
)

// A hit goes to the client as a *dns.Msg built from the reply bytes, since
// the plugins before the cache wrap the ResponseWriter and read what
// WriteMsg is given, unless every plugin of the block is one whose writer
// the cache can satisfy with the bytes themselves (plan.raw); unpacking and
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

// rawWrite writes reply, a hit's bytes, to w, a writer of a block whose
// plan is raw: it gives the metrics recorders on the way the reply's rcode,
// which their Write does not learn, and writes below loadbalance's writer.
func rawWrite(w dns.ResponseWriter, reply []byte) error {
	rcode := int(reply[3] & 0xF)
	target := w
	for cur := w; cur != nil; cur = coredns.Inner(cur) {
		switch t := cur.(type) {
		case *metrics.Recorder:
			t.Rcode = rcode
		case *loadbalance.LoadBalanceResponseWriter:
			target = t.ResponseWriter
		}
	}
	_, err := target.Write(reply)
	return err
}
