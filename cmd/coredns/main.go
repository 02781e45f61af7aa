// Command coredns is CoreDNS with every plugin of its own plus compactcache.
//
// It is the stock CoreDNS binary with one more directive, so any Corefile that
// works with stock CoreDNS works here, and writing compactcache where a block
// says cache switches caches.
package main

import (
	"slices"

	_ "github.com/compactcache/compactcache" // Registers the compactcache directive.
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/core/plugin" // All of CoreDNS's own plugins.
	"github.com/coredns/coredns/coremain"
)

// init places compactcache in the plugin chain where cache stands. The order
// of dnsserver.Directives, not of the Corefile, is the order of the chain, and
// a directive missing from it is rejected when the Corefile is parsed. The
// server type reads the list only when caddy parses a Corefile, which happens
// in coremain.Run, after every init.
func init() {
	i := slices.Index(dnsserver.Directives, "cache")
	if i < 0 {
		// Without "cache" we would not know where compactcache belongs; a
		// guess could put it behind forward, where it never sees a reply.
		panic(`coredns: directive "cache" not found in dnsserver.Directives`)
	}
	if err := dnsserver.SetDirectives(slices.Insert(slices.Clone(dnsserver.Directives), i, "compactcache")); err != nil {
		panic("coredns: " + err.Error())
	}
}

func main() { coremain.Run() }
