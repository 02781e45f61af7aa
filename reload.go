package compactcache

import (
	"strings"
	"sync"
)

// On reload, CoreDNS starts a new instance of every plugin before it stops
// the old ones. The stock cache starts empty. compactcache hands its store
// to its successor in the same server block instead, when the settings that
// shape the store (budget, entry caps, stale window) are unchanged, so that a
// reload neither drops the cache nor holds two full stores.

// handoffs holds the stores that instances being reloaded offer, by block.
var handoffs = struct {
	sync.Mutex
	m map[string]*store
}{m: map[string]*store{}}

func blockID(keys []string) string { return strings.Join(keys, " ") }

// offer makes s available to the next instance of the block; caddy calls it
// just before a reload.
func offer(block string, s *store) {
	handoffs.Lock()
	defer handoffs.Unlock()
	handoffs.m[block] = s
}

// withdraw takes back what the block offered and nobody took, once the
// reload is over or failed.
func withdraw(block string, s *store) {
	handoffs.Lock()
	defer handoffs.Unlock()
	if handoffs.m[block] == s {
		delete(handoffs.m, block)
	}
}

// takeOver replaces c's new, empty store by the store offered for block
// when it has the same shape.
func (c *Cache) takeOver(block string) bool {
	handoffs.Lock()
	defer handoffs.Unlock()
	old, ok := handoffs.m[block]
	if !ok || !old.sameShape(c.store) {
		return false
	}
	delete(handoffs.m, block)
	c.store = old
	return true
}
