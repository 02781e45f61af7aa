package compactcache

import (
	"io"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/entry"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/snapshot"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/miekg/dns"
)

// operator is a block's cache as the admin endpoint (adminserver.Cache) and
// snapshots and warm-ups (persist.Cache) reach it, beyond the plugin's API.
type operator struct{ c *Cache }

func (o operator) Flush(f flush.Flush) (admin.Counts, error) { return o.c.flush(f) }
func (o operator) Stats() admin.Stats                        { return o.c.stats() }

func (o operator) Entries(name []byte, types []uint16, each func(e entry.Entry)) {
	o.c.nameKeys(name, types, func(key []byte) {
		o.c.store.Get(key, o.c.store.Hash(key), func(e entry.Entry) bool {
			each(e)
			return true
		})
	})
}

func (o operator) Walk(visit func(e entry.Entry), between func() error) error {
	return o.c.walk(func(e entry.Entry) bool { visit(e); return false }, between)
}

func (o operator) Store() *store.Store               { return o.c.store }
func (o operator) Fingerprint() snapshot.Fingerprint { return o.c.fingerprint() }
func (o operator) Now() int64                        { return o.c.now().Unix() }
func (o operator) Grace() int64                      { return int64(o.c.StaleUpTo / time.Second) }
func (o operator) Fence() *flush.Fence               { return o.c.fence }
func (o operator) MaxTTL() int64                     { return o.c.LongestTTL() }

func (o operator) Snapshot(w io.Writer) (int, error) {
	return snapshot.Write(w, o.c.store.Paced(0), o.c.fingerprint(), o.c.now().Unix())
}

// stats reads the entries per kind as the store counts them, counts the
// rest of what it holds walking it, and reads the block's counters.
func (c *Cache) stats() admin.Stats {
	var st admin.Stats
	now := c.now().Unix()
	grace := int64(c.StaleUpTo / time.Second)
	c.walk(func(e entry.Entry) bool {
		k := store.KindOf(e)
		count(&st.Bytes, k, int64(e.Size()))
		if k == store.KindMeta {
			return false
		}
		switch {
		case e.Rcode() == dns.RcodeServerFailure:
			st.ServFail++
		case e.Rcode() == dns.RcodeNameError:
			st.NXDomain++
		case k == store.KindDenial:
			st.NoData++
		}
		if now >= e.Expires() {
			st.Expired++
			if now-e.Expires() < grace {
				st.Stale++
			}
		}
		return false
	}, nil)
	u := c.store.Usage()
	for k, n := range u.Kinds {
		count(&st.Entries, k, int64(n))
	}
	st.ECSVariants, st.Held, st.Capacity = int64(u.Variants), u.Held, c.store.Capacity()
	t := c.metrics.Totals(c.listen)
	st.Requests, st.Hits, st.Misses = t.Requests, t.Hits, t.Misses
	for k, n := range t.Evictions {
		count(&st.Evictions, k, n)
	}
	if st.Requests > 0 {
		st.HitRatio = float64(st.Hits) / float64(st.Requests)
	}
	if c.shared != nil {
		st.Shared = c.shared.Stats()
	}
	st.Kubernetes = c.KubernetesStats()
	return st
}
