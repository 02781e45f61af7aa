package compactcache

import (
	"sync"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/kube"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
)

// Invalidation from the Kubernetes API (the kubernetes option): a block's
// internal/kube source learns of the cluster's changes and hands the
// cache Flushes, applied as every other flush is (Cache.Flush). The cache
// itself knows nothing of Kubernetes; this file only starts and stops the
// source with the block.

// invalidators are the running sources, by cache: the admin stats read
// them (KubernetesStats).
var invalidators sync.Map // *Cache → *kube.Invalidator

// setupKubernetes starts the block's source once its chain is known (the
// plugins after the cache, where the kubernetes plugin to follow is), and
// stops it with the block. A source that cannot start fails the start,
// with what to write instead.
func setupKubernetes(c *caddy.Controller, ca *Cache) {
	if ca.Kubernetes == nil {
		return
	}
	c.OnStartup(func() error {
		cfg := dnsserver.GetConfig(c)
		hs := cfg.Handlers()
		var next []plugin.Handler
		for i, h := range hs {
			if h.Name() == pluginName {
				next = hs[i+1:]
				break
			}
		}
		inv, err := kube.Start(ca.Kubernetes, next, kube.Target{Flush: ca.Flush, Zones: ca.Zones, View: cfg.ViewName})
		if err != nil {
			return plugin.Error(pluginName, err)
		}
		invalidators.Store(ca, inv)
		unstartedSources.add(ca)
		pending, _ := c.Get(kubeSourcesKey{}).([]*Cache)
		c.Set(kubeSourcesKey{}, append(pending, ca))
		return nil
	})
	c.OnShutdown(func() error {
		stopSource(ca)
		return nil
	})
	// A reload failed: the new instance, whose sources may have started,
	// never starts its servers nor shuts down. caddy runs this instance's
	// hook (the old one's, still serving), which stops the new one's
	// sources, not its own.
	c.OnRestartFailed(func() error {
		unstartedSources.stopAll()
		return nil
	})
}

// stopSource stops the source of ca's block, if it has one running.
func stopSource(ca *Cache) {
	if inv, ok := invalidators.LoadAndDelete(ca); ok {
		inv.(*kube.Invalidator).Stop()
	}
}

// kubeSourcesKey keeps, in a caddy instance's storage, the caches of its
// blocks whose sources started, until the instance's servers are up.
type kubeSourcesKey struct{}

func init() { caddy.RegisterEventHook("compactcache-kubernetes", sourcesStarted) }

// sourcesStarted marks the sources of an instance whose servers are up as
// started, and stops those left of instances that never started: a failed
// reload from an instance without compactcache, whose hook would have.
func sourcesStarted(event caddy.EventName, info any) error {
	inst, ok := info.(*caddy.Instance)
	if event != caddy.InstanceStartupEvent || !ok {
		return nil
	}
	inst.StorageMu.RLock()
	started, _ := inst.Storage[kubeSourcesKey{}].([]*Cache)
	inst.StorageMu.RUnlock()
	for _, ca := range started {
		unstartedSources.remove(ca)
	}
	unstartedSources.stopAll()
	return nil
}

// unstartedSources are the blocks whose sources run and whose instance's
// servers are not up yet.
var unstartedSources = cacheSet{m: map[*Cache]bool{}}

type cacheSet struct {
	mu sync.Mutex
	m  map[*Cache]bool
}

func (s *cacheSet) add(ca *Cache) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[ca] = true
}

func (s *cacheSet) remove(ca *Cache) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, ca)
}

// stopAll stops the sources of the set's blocks, and empties it.
func (s *cacheSet) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ca := range s.m {
		stopSource(ca)
		delete(s.m, ca)
	}
}

// KubernetesStats is what the block's invalidation from the Kubernetes API
// has done since it started; nil without one.
func (c *Cache) KubernetesStats() *admin.Kubernetes {
	inv, ok := invalidators.Load(c)
	if !ok {
		return nil
	}
	st := inv.(*kube.Invalidator).Stats()
	return &st
}
