package kube

import (
	"sync/atomic"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/prometheus/client_golang/prometheus"
)

// The families of a block's invalidation, by the block's zones and view.
var (
	invalidations = cachemetrics.CounterVec("invalidations_total", cachemetrics.OptionLabels("kind"),
		"The cluster changes that made cached answers wrong, by kind: service, endpoints (an EndpointSlice), pod (a change that may be a Pod's, under pods verified), namespace (its first Service came or its last went, or it appeared or went).")
	flushedNames = cachemetrics.CounterVec("invalidated_names_total", cachemetrics.OptionLabels("scope"),
		"The names the cluster's changes flushed, by scope: name (the entries of one name), subtree (a name and all below it).")
	connected = cachemetrics.GaugeVec("kubernetes_connected", cachemetrics.OptionLabels(),
		"1 while the block learns of the cluster's changes from the Kubernetes API, 0 while it does not (not synced, watch failing, API server unreachable): cluster answers then keep their TTL.")
)

// counters are a block's numbers, for the Prometheus series and Stats.
type counters struct {
	kinds    [numKinds]atomic.Int64
	series   [numKinds]prometheus.Counter
	names    atomic.Int64
	subtrees atomic.Int64
	nameS    prometheus.Counter
	subtreeS prometheus.Counter
	dropped  struct{ success, denial, ecs atomic.Int64 }
	up       atomic.Bool
	lost     atomic.Int64
	gauge    prometheus.Gauge
}

func newCounters(zones, view string) *counters {
	c := &counters{}
	for k := range numKinds {
		c.series[k] = invalidations.WithLabelValues(zones, view, k.String())
	}
	c.nameS = flushedNames.WithLabelValues(zones, view, "name")
	c.subtreeS = flushedNames.WithLabelValues(zones, view, "subtree")
	c.gauge = connected.WithLabelValues(zones, view)
	c.gauge.Set(0)
	return c
}

func (c *counters) changed(n [numKinds]int64) {
	for k, v := range n {
		if v > 0 {
			c.kinds[k].Add(v)
			c.series[k].Add(float64(v))
		}
	}
}

func (c *counters) flushed(f flush.Flush, dropped admin.Counts) {
	n := int64(len(f.Names))
	if f.Scope == flush.Zones {
		c.subtrees.Add(n)
		c.subtreeS.Add(float64(n))
	} else {
		c.names.Add(n)
		c.nameS.Add(float64(n))
	}
	c.dropped.success.Add(dropped.Success)
	c.dropped.denial.Add(dropped.Denial)
	c.dropped.ecs.Add(dropped.ECSList)
}

// connected records the connection's state, reporting whether it changed.
func (c *counters) connected(up bool) bool {
	if c.up.Swap(up) == up {
		return false
	}
	if up {
		c.gauge.Set(1)
	} else {
		c.gauge.Set(0)
		c.lost.Add(1)
	}
	return true
}

func (c *counters) stats(source string) admin.Kubernetes {
	return admin.Kubernetes{
		Source: source, Connected: c.up.Load(),
		Services: c.kinds[kindService].Load(), Endpoints: c.kinds[kindEndpoints].Load(),
		Pods: c.kinds[kindPod].Load(), Namespaces: c.kinds[kindNamespace].Load(),
		Names: c.names.Load(), Subtrees: c.subtrees.Load(),
		Dropped:     admin.Counts{Success: c.dropped.success.Load(), Denial: c.dropped.denial.Load(), ECSList: c.dropped.ecs.Load()},
		Disconnects: c.lost.Load(),
	}
}
