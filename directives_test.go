package compactcache

import (
	"slices"

	"github.com/coredns/coredns/core/dnsserver"

	// The plugins the in-process servers of server_test.go and chain_test.go
	// configure. Only these are linked into the test binary: importing
	// core/plugin (as github.com/coredns/coredns/test does) would link every
	// CoreDNS plugin, kubernetes and the cloud backends included.
	_ "github.com/coredns/coredns/plugin/acl"
	_ "github.com/coredns/coredns/plugin/autopath"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/bufsize"
	_ "github.com/coredns/coredns/plugin/dns64"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/rewrite"
	_ "github.com/coredns/coredns/plugin/siit"
	_ "github.com/coredns/coredns/plugin/tsig"
	_ "github.com/coredns/coredns/plugin/view"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// init places compactcache in the directive list just before cache, as
// cmd/coredns does for the real build: the order of dnsserver.Directives is
// the order of the plugin chain, and a directive missing from it is rejected
// when a Corefile is parsed. caddy reads the list when it parses a Corefile,
// after every init.
func init() {
	if slices.Contains(dnsserver.Directives, pluginName) {
		return
	}
	i := slices.Index(dnsserver.Directives, "cache")
	if i < 0 {
		panic(`directive "cache" not found in dnsserver.Directives`)
	}
	if err := dnsserver.SetDirectives(slices.Insert(slices.Clone(dnsserver.Directives), i, pluginName)); err != nil {
		panic(err)
	}
}
