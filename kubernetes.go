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
		return nil
	})
	stop := func() error {
		if inv, ok := invalidators.LoadAndDelete(ca); ok {
			inv.(*kube.Invalidator).Stop()
		}
		return nil
	}
	c.OnShutdown(stop)
	c.OnRestartFailed(stop) // a new instance that failed to start never shuts down

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
