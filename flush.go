package compactcache

import (
	"fmt"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/store"
)

// The invalidation seam: every flush, an operator's, a peer replica's or
// one the Kubernetes API calls for, is a flush.Flush applied here. Flushes
// of names probe the keys their entries may be stored under, as Unbound's
// flush does, rather than scan; the others walk the store a chunk at a
// time, resting between chunks (walkRest).

// Flush drops the entries f covers from the store and counts them, and
// where the block shares a tier, from the tier and every other replica's
// store.
func (c *Cache) Flush(f flush.Flush) admin.Counts {
	n, _ := c.flush(f)
	return n
}

// flush is Flush, and reports a flush that the shared tier did not take:
// it is applied to this replica's store all the same. The fetches in
// flight are fenced off first, so that none stores, here or in the tier,
// what the tier's flush covers; the store goes last, so that a miss in
// between does not bring back from the tier what the store dropped.
func (c *Cache) flush(f flush.Flush) (admin.Counts, error) {
	now := c.now().Unix()
	c.fence.BeginFlush(f, now)
	var err error
	if c.shared != nil {
		if err = c.shared.Flush(f, now); err != nil {
			err = fmt.Errorf("not applied to the shared tier or the other replicas: %w", err)
			log.Warningf("Flush %s: %v", f.String(), err)
		}
	}
	return c.drop(f, now), err
}

// flushLocal drops the entries f, another replica's flush, covers from the
// store and counts them.
func (c *Cache) flushLocal(f flush.Flush) admin.Counts {
	now := c.now().Unix()
	c.fence.BeginFlush(f, now)
	return c.drop(f, now)
}

// drop removes the entries f covers from the store and counts them.
func (c *Cache) drop(f flush.Flush, now int64) admin.Counts {
	if f.Scope == flush.Names {
		return c.flushNames(f.Names, f.Types)
	}
	var n admin.Counts
	c.walk(func(e entry.Entry) bool {
		if !f.Covers(e, now) {
			return false
		}
		count(&n, store.KindOf(e), 1)
		return true
	}, nil)
	return n
}

// flushNames removes every entry of names with one of types (every type
// entry.ProbeTypes has when types is empty), and the names' ECS lists.
func (c *Cache) flushNames(names [][]byte, types []uint16) admin.Counts {
	var n admin.Counts
	for _, name := range names {
		c.nameKeys(name, types, func(key []byte) {
			kind := -1
			if c.store.Get(key, c.store.Hash(key), func(e entry.Entry) bool {
				kind = store.KindOf(e)
				return true
			}) {
				c.store.Remove(key)
				count(&n, kind, 1)
			}
		})
	}
	return n
}

// walk visits every entry of the store at the pace of walkRest; between
// (when given) runs after each chunk with no lock held, and stops the walk
// with its error.
func (c *Cache) walk(visit func(e entry.Entry) (remove bool), between func() error) error {
	return c.store.Paced(walkRest)(visit, between)
}

// walkRest is how many times as long as a chunk took a walk rests after
// it, keeping a walk to a quarter of a core.
var walkRest = time.Duration(3)

// count counts one entry of kind k.
func count(n *admin.Counts, k int, by int64) {
	switch k {
	case store.KindSuccess:
		n.Success += by
	case store.KindDenial:
		n.Denial += by
	default:
		n.ECSList += by
	}
}

// listed appends to dst the variants the list under key holds.
func (c *Cache) listed(key []byte, dst []entry.Variant) []entry.Variant {
	c.store.Get(key, c.store.Hash(key), func(e entry.Entry) bool {
		l := e.List()
		for i := range l.Count() {
			dst = append(dst, l.Item(i))
		}
		return true
	})
	return dst
}

// nameKeys calls f with each key an entry of name (lowercased wire form)
// and one of types (entry.ProbeTypes when empty) may be stored under in c.
func (c *Cache) nameKeys(name []byte, types []uint16, f func(key []byte)) {
	entry.NameKeys(name, entry.Probe{Types: types, Other: c.PreferPositive, Variants: c.listed}, f)
}
