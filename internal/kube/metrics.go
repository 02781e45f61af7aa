package kube

import (
	"slices"
	"sync"
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
	labels   [2]string // zones, view
}

// holders are the counters of the running sources that hold each
// connected series, by its labels: the old and the new instance's source
// of a block across a reload, and blocks of the same zones and view. The
// series says 1 while one of them is connected, and goes with the last of
// them: one left behind by a source that no longer runs would say
// connected for good.
var holders = struct {
	sync.Mutex
	m map[[2]string][]*counters
}{m: map[[2]string][]*counters{}}

func newCounters(zones, view string) *counters {
	c := &counters{}
	for k := range numKinds {
		c.series[k] = invalidations.WithLabelValues(zones, view, k.String())
	}
	c.nameS = flushedNames.WithLabelValues(zones, view, "name")
	c.subtreeS = flushedNames.WithLabelValues(zones, view, "subtree")
	c.labels = [2]string{zones, view}
	holders.Lock()
	holders.m[c.labels] = append(holders.m[c.labels], c)
	holders.Unlock()
	c.setGauge()
	return c
}

// setGauge sets the connected series from its holders, unless c holds it
// no more: a stopped source's word comes too late.
func (c *counters) setGauge() {
	holders.Lock()
	defer holders.Unlock()
	hs := holders.m[c.labels]
	if !slices.Contains(hs, c) {
		return
	}
	v := 0.0
	for _, h := range hs {
		if h.up.Load() {
			v = 1
		}
	}
	connected.WithLabelValues(c.labels[0], c.labels[1]).Set(v)
}

// release lets go of the connected series as c's source stops: the series
// goes unless another running source holds it.
func (c *counters) release() {
	holders.Lock()
	hs := slices.DeleteFunc(holders.m[c.labels], func(h *counters) bool { return h == c })
	if len(hs) == 0 {
		delete(holders.m, c.labels)
		connected.DeleteLabelValues(c.labels[0], c.labels[1])
		holders.Unlock()
		return
	}
	holders.m[c.labels] = hs
	holders.Unlock()
	hs[0].setGauge()
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
	if !up {
		c.lost.Add(1)
	}
	c.setGauge()
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
