// Package kube owns invalidation from the Kubernetes API: it learns of
// the changes of a cluster's Services, EndpointSlices and (pods verified)
// Pods, works out which names of the cluster zones answer differently
// because of them, and hands a block's cache the flush.Flush values that
// drop those names, coalesced, within a second of the change. It reads
// changes from the kubernetes plugin's own informers where the block has
// the plugin (follow.go), or from a watch of its own, Services and
// EndpointSlices only, where it has not (watch.go). It says when it loses
// the API server (a log line, a gauge); the cache's entries then keep
// their TTL. The cache knows nothing of Kubernetes: it applies Flushes.
package kube

import (
	"fmt"
	"strings"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/dnsmsg"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/kubernetes"
	clog "github.com/coredns/coredns/plugin/pkg/log"
)

var log = clog.NewWithPlugin("compactcache")

// Target is the block whose cache a source flushes.
type Target struct {
	// Flush drops a Flush's entries from the cache: (*Cache).Flush.
	Flush func(flush.Flush) admin.Counts
	// Zones are the cache's zones: names outside them are not flushed.
	Zones []string
	// View is the block's view, for the metrics' labels.
	View string
	// Block names the block across reloads (its keys, binds and view):
	// the source of its next instance takes over this one's last view of
	// the cluster (handoff.go).
	Block string
}

// Invalidator is a block's invalidation, running.
type Invalidator struct {
	source string
	c      *counters
	stop   func()
	load   func() *admin.KubernetesAPI
	base   *baseline
	last   func() *state // once stopped
	up     func()        // the block's servers are up; nil for nothing to do
}

// Start starts invalidating t's cache as cfg says; next are the plugins
// after the cache in the block's chain, where the kubernetes plugin to
// follow is. A block whose option asks to follow a plugin it has not, or
// to watch beside the plugin it has, does not start.
func Start(cfg *Config, next []plugin.Handler, t Target) (_ *Invalidator, err error) {
	var k *kubernetes.Kubernetes
	for _, h := range next {
		if kk, ok := h.(*kubernetes.Kubernetes); ok {
			k = kk
			break
		}
	}
	for _, h := range next {
		if h.Name() == "autopath" {
			// The directive order puts autopath before the cache; a build
			// that moves it after has its replies cached under the names
			// clients ask, which no change names.
			log.Warningf("kubernetes: autopath follows compactcache in the chain: its replies keep their TTL")
		}
	}
	zones := strings.Join(t.Zones, ",")
	c := newCounters(zones, t.View)
	defer func() {
		if err != nil {
			// A block that does not start holds no connected series.
			c.release()
		}
	}()
	keep := dnsmsg.NewZoneSet(t.Zones)
	logf := func(source string) func(bool, string) {
		return func(up bool, why string) {
			if up {
				log.Infof("kubernetes: zones %s follow the cluster's changes through %s", zones, source)
			} else {
				log.Warningf("kubernetes: zones %s no longer learn of the cluster's changes: %s; cached cluster answers keep their TTL", zones, why)
			}
		}
	}
	if !cfg.watch {
		if k == nil {
			return nil, fmt.Errorf("kubernetes: the block has no kubernetes plugin after compactcache to follow; for a watch of its own, give the cluster's zones: kubernetes cluster.local in-addr.arpa ip6.arpa")
		}
		if k.APIConn == nil {
			return nil, fmt.Errorf("kubernetes: the block's kubernetes plugin has no controller")
		}
		opts := optionsOf(k)
		if len(opts.missing) > 0 {
			log.Warningf("kubernetes: the kubernetes plugin's %s not found: taken at the setting that flushes more", strings.Join(opts.missing, ", "))
		}
		n := newNamer(k.Zones)
		n.PodNames, n.Zonal = opts.podNames, opts.zonal
		view := newClusterView(n)
		view.namespaces, view.ignoreEmpty = k.Namespaces, opts.ignoreEmpty
		view.setServers(nil)
		var probe *prober
		if rc, err := pluginConn(k); err == nil {
			probe, _ = newProber(rc)
		}
		f := newFollow(k.APIConn, view, newEmitter(t.Flush, keep, 0, c), c, newBaseline(t.Block), opts, probe, logf("the kubernetes plugin"))
		go f.run()
		inv := f.invalidator()
		// The plugin learns its addresses as its servers start, after this
		// block's startup: read them once they are up.
		inv.up = func() { view.setServers(optionsOf(k).servers) }
		return inv, nil
	}
	if k != nil {
		return nil, fmt.Errorf("kubernetes: the block has the kubernetes plugin: write kubernetes alone to follow its informers rather than watch the API server a second time")
	}
	names := cfg.zones
	if len(names) == 0 {
		names = t.Zones
	}
	for _, z := range names {
		if z == "." {
			return nil, fmt.Errorf("kubernetes: the root zone is not a cluster's: give the cluster's zones, e.g. kubernetes cluster.local in-addr.arpa ip6.arpa")
		}
	}
	n := newNamer(names)
	n.PodNames = cfg.podNames
	w, err := acquire(cfg.conn)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	// A second flush a second after the first: the cluster DNS this cache
	// asks learns of the change on its own watch, and may answer the old
	// records until it has.
	s, err := subscribe(w, watchView(n), newEmitter(t.Flush, keep, againAfter, c), c, newBaseline(t.Block), logf("a watch of the API server"))
	if err != nil {
		w.release()
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return &Invalidator{source: "watch", c: c, stop: s.close, load: w.load, base: s.base, last: s.last}, nil
}

func (f *follow) invalidator() *Invalidator {
	return &Invalidator{source: "kubernetes plugin", c: f.c, base: f.base, last: f.last,
		stop: func() { close(f.stop); <-f.done }}
}

// watchView is the view of a watch of its own. The cluster DNS's options
// are unknown to it: ignore empty_service is taken at the setting that
// flushes more, as optionsOf takes an option it cannot read, and so are
// the nameserver's addresses, its pods' (any address may be one); zonal is
// not, since under it every change of a headless Service's endpoints would
// walk the whole store for names that only a cluster DNS with zonal
// answers.
func watchView(n namer) *clusterView {
	v := newClusterView(n)
	v.ignoreEmpty = true
	v.setServers(nil)
	return v
}

// againAfter is when a watch of its own flushes a batch of names again.
const againAfter = time.Second

// Started tells the invalidation that its block's servers are up.
func (i *Invalidator) Started() {
	if i.up != nil {
		i.up()
	}
}

// Stop stops the invalidation, flushing what it has learnt meanwhile.
func (i *Invalidator) Stop() {
	i.stop()
	i.c.release()
}

// Stats is what the invalidation has done since it started, for the admin
// stats.
func (i *Invalidator) Stats() admin.Kubernetes {
	st := i.c.stats(i.source)
	if i.load != nil {
		st.API = i.load()
	}
	return st
}
