// Package bench measures compactcache beside the stock cache plugin on the
// reference workload (package workload): both caches are set up from Corefile
// text by their own setup functions, in front of an upstream that answers
// every entry, and driven the way the server drives a plugin.
package bench

import (
	"fmt"

	"github.com/compactcache/compactcache"
	"github.com/compactcache/compactcache/internal/workload"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	_ "github.com/coredns/coredns/plugin/cache" // registers the stock cache's directive
)

// Kind is a cache plugin, named by its Corefile directive.
type Kind string

// The two caches compared.
const (
	Stock   Kind = "cache"
	Compact Kind = "compactcache"
)

// Cache is a cache plugin set up from a Corefile, in front of an upstream.
type Cache struct {
	plugin.Handler
	Kind Kind
	// Compact is the compactcache plugin, nil for the stock cache.
	Compact *compactcache.Cache
}

// NewStock returns the stock cache holding up to entries success entries and
// as many denial entries, its TTL cap that of the workload's records.
func NewStock(entries int, next plugin.Handler) (*Cache, error) {
	return build(Stock, fmt.Sprintf("cache %d {\n success %d\n denial %d\n}", workload.TTL, entries, entries), next)
}

// NewCompact returns compactcache with a byte budget of capacity, rounded up
// to whole MiB.
func NewCompact(capacity int64, next plugin.Handler) (*Cache, error) {
	return build(Compact, fmt.Sprintf("compactcache {\n capacity %dMiB\n}", (capacity+1<<20-1)>>20), next)
}

// build runs the directive's registered setup function on corefile, as
// CoreDNS does when it reads a server block, and chains the plugin in front
// of next.
func build(kind Kind, corefile string, next plugin.Handler) (*Cache, error) {
	setup, err := caddy.DirectiveAction("dns", string(kind))
	if err != nil {
		return nil, err
	}
	ctrl := caddy.NewTestController("dns", corefile)
	// The server block's key, as in ". { cache }": without it the plugin has
	// no zones and passes every query on.
	ctrl.ServerBlockKeys = []string{"."}
	if err := setup(ctrl); err != nil {
		return nil, fmt.Errorf("%s: %v", kind, err)
	}
	cfg := dnsserver.GetConfig(ctrl)
	if len(cfg.Plugin) != 1 {
		return nil, fmt.Errorf("%s: setup added %d plugins, want 1", kind, len(cfg.Plugin))
	}
	c := &Cache{Handler: cfg.Plugin[0](next), Kind: kind}
	if kind == Compact {
		cc, ok := c.Handler.(*compactcache.Cache)
		if !ok {
			return nil, fmt.Errorf("%s: setup made a %T, want *compactcache.Cache", kind, c.Handler)
		}
		c.Compact = cc
	}
	return c, nil
}
