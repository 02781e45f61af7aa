package compactcache

import (
	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/kube"
	"github.com/coredns/caddy"
)

// Invalidation from the Kubernetes API (the kubernetes option): a block's
// internal/kube source learns of the cluster's changes and hands the
// cache Flushes, applied as every other flush is (Cache.Flush). The cache
// itself knows nothing of Kubernetes; internal/kube starts and stops the
// source with the block.

// setupKubernetes starts the block's source with the block, if it has one.
func setupKubernetes(c *caddy.Controller, ca *Cache) {
	if ca.Kubernetes == nil {
		return
	}
	kube.Setup(c, ca, ca.Kubernetes, pluginName, func(view string) kube.Target {
		return kube.Target{Flush: ca.Flush, Zones: ca.Zones, View: view}
	})
}

// KubernetesStats is what the block's invalidation from the Kubernetes API
// has done since it started; nil without one.
func (c *Cache) KubernetesStats() *admin.Kubernetes { return kube.StatsOf(c) }
