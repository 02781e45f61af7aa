package compactcache

import (
	"crypto/sha256"
	"fmt"

	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/compactcache/compactcache/internal/store"
	"strings"
	"time"
)

// On reload, CoreDNS starts a new instance of every plugin before it stops
// the old ones. The stock cache starts empty. compactcache hands its store
// to its successor in the same server block instead, when the settings that
// shape the store (budget, entry caps, stale window) and those that decide
// what it holds (contents) are unchanged and its zones not narrowed, so that
// a reload neither drops the cache nor holds two full stores, and a changed
// TTL cap or disable takes effect at once, as with the stock cache.

// handoff is a store on offer, the flushes begun on it, and the contents
// settings and zones it was filled under.
type handoff struct {
	store    *store.Store
	fence    *flush.Fence
	contents contents
	zones    dnsmsg.ZoneSet
}

// contents are the settings that decide which replies a store holds, for how
// long, and under which keys.
type contents struct {
	pttl, minpttl, nttl, minnttl, failttl time.Duration
	pexcept, nexcept                      string // the disable zones, joined
	ecs                                   ecsConfig
	preferPositive                        bool
}

func (c *Cache) contents() contents {
	return contents{
		pttl: c.SuccessTTL, minpttl: c.SuccessMinTTL, nttl: c.DenialTTL, minnttl: c.DenialMinTTL, failttl: c.ServfailTTL,
		pexcept: strings.Join(c.DisableSuccess, " "), nexcept: strings.Join(c.DisableDenial, " "),
		ecs: c.ecs, preferPositive: c.PreferPositive,
	}
}

// blockID names a server block for handoffs: by its keys, its bind
// addresses and its view, since blocks that bind other addresses, and the
// views of one address, share their keys.
func blockID(keys, binds []string, view string) string {
	id := strings.Join(keys, " ")
	if b := strings.TrimSpace(strings.Join(binds, " ")); b != "" {
		id += " (bind " + b + ")"
	}
	if view != "" {
		id += " (view " + view + ")"
	}
	return id
}

// offer makes c's store available to the next instance of the block; caddy
// calls it just before a reload.
func (c *Cache) offer(block string) {
	handoffs.Lock()
	defer handoffs.Unlock()
	handoffs.m[block] = handoff{c.store, c.fence, c.contents(), c.zones}
}

// withdraw takes back what the block offered and nobody took, once the
// reload is over or failed.
func withdraw(block string, s *store.Store) {
	handoffs.Lock()
	defer handoffs.Unlock()
	if handoffs.m[block].store == s {
		delete(handoffs.m, block)
	}
}

// takeOver replaces c's new, empty store, and its flushes, by the store
// offered for block and the flushes begun on it, when it has the same shape,
// contents settings and no zone c drops: kubernetes flushes only c's zones,
// and a later reload that took the zone back would serve what they missed.
func (c *Cache) takeOver(block string) bool {
	handoffs.Lock()
	defer handoffs.Unlock()
	old, ok := handoffs.m[block]
	if !ok || !old.store.SameShape(c.store) || old.contents != c.contents() || !c.zones.Covers(old.zones) {
		return false
	}
	delete(handoffs.m, block)
	c.store, c.fence = old.store, old.fence
	return true
}

// fingerprint names the settings that decide what c's entries hold, and
// the entry format: a snapshot, a peer's stream or a shared tier's value
// written under others is not read.
func (c *Cache) fingerprint() snapshot.Fingerprint {
	return snapshot.Fingerprint(sha256.Sum256([]byte(fmt.Sprintf("compactcache entries %d %+v", entry.Format, c.contents()))))
}
