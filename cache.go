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

// Stats is a snapshot of the store's occupancy.
type Stats struct {
	Entries  int64 // entries stored, success and denial
	Bytes    int64 // bytes the store holds: arenas and index
	Capacity int64 // the byte budget
}

// Stats returns the store's occupancy.
func (c *Cache) Stats() Stats { return Stats{} }

// SetRawWrites makes hits reach the client through w.Write with the reply
// bytes instead of WriteMsg with a *dns.Msg built from them. Setup turns it on
// when no plugin in the server block needs WriteMsg.
func (c *Cache) SetRawWrites(on bool) {}
