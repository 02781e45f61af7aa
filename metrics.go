package compactcache

import (
	"sync"
	"sync/atomic"

	"github.com/coredns/coredns/plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The families of the stock cache, under coredns_compactcache_ and with the
// same labels, plus the byte budget's and ECS's.
var (
	cacheSize = gaugeVec("entries", kindedLabels,
		"The number of elements in the cache.")
	cacheRequests = counterVec("requests_total", blockLabels,
		"The count of cache requests.")
	cacheHits = counterVec("hits_total", kindedLabels,
		"The count of cache hits.")
	cacheMisses = counterVec("misses_total", blockLabels,
		"The count of cache misses. Deprecated, derive misses from cache hits/requests counters.")
	cacheDrops = counterVec("drops_total", blockLabels,
		"The number of responses that are not cached because they are malformed, truncated or do not match the request.")
	evictions = counterVec("evictions_total", kindedLabels,
		"The count of cache evictions.")
	cacheBytes = gaugeVec("bytes", blockLabels,
		"The bytes the cache holds: arenas, index and bookkeeping.")
	cacheCapacity = gaugeVec("capacity_bytes", blockLabels,
		"The byte budget of the cache.")
	cachePrefetches = counterVec("prefetch_total", blockLabels,
		"The number of times the cache has prefetched a cached item.")
	servedStale = counterVec("served_stale_total", blockLabels,
		"The number of requests served from stale cache entries.")
	ecsVariants = gaugeVec("ecs_variants", blockLabels,
		"The number of entries tailored to a client subnet (EDNS Client Subnet).")
	cacheRefused = counterVec("refused_total", blockLabels,
		"The number of responses not cached because they exceed the per-entry limit.")
	frontendRequests = counterVec("frontend_requests_total", resultLabels,
		"The requests the front end read, by result: hit (answered from the cache), chain (handed to the server block), shed (dropped: the chain had too many in flight), dropped (unreadable or cut by the socket buffer).")
)

// The labels of the stock cache's families: per block, and per kind of entry.
var (
	blockLabels  = []string{"server", "zones", "view"}
	kindedLabels = []string{"server", "type", "zones", "view"}
	resultLabels = []string{"server", "zones", "view", "result"}
)

func gaugeVec(name string, labels []string, help string) *prometheus.GaugeVec {
	return promauto.NewGaugeVec(prometheus.GaugeOpts{Namespace: plugin.Namespace, Subsystem: pluginName, Name: name, Help: help}, labels)
}

func counterVec(name string, labels []string, help string) *prometheus.CounterVec {
	return promauto.NewCounterVec(prometheus.CounterOpts{Namespace: plugin.Namespace, Subsystem: pluginName, Name: name, Help: help}, labels)
}

// Type label values, as the stock cache's.
var kindLabels = [...]string{kindSuccess: "success", kindDenial: "denial"}

// serverMetrics holds one server's resolved metrics, so that the hit path
// does not hash label values on every request.
type serverMetrics struct {
	server    string
	requests  prometheus.Counter
	misses    prometheus.Counter
	drops     prometheus.Counter
	refused   prometheus.Counter
	prefetch  prometheus.Counter
	stale     prometheus.Counter
	hits      [2]prometheus.Counter
	evictions [2]prometheus.Counter
	entries   [2]prometheus.Gauge
	bytes     prometheus.Gauge
	capacity  prometheus.Gauge
	variants  prometheus.Gauge
}

// metricsSet maps servers to their metrics. A block serves few servers, so a
// copy-on-write slice scanned linearly beats a map and allocates nothing.
type metricsSet struct {
	zones, view string
	mu          sync.Mutex
	servers     atomic.Pointer[[]*serverMetrics]
}

func (s *metricsSet) of(server string) *serverMetrics {
	if p := s.servers.Load(); p != nil {
		for _, m := range *p {
			if m.server == server {
				return m
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var list []*serverMetrics
	if p := s.servers.Load(); p != nil {
		list = *p
	}
	for _, m := range list {
		if m.server == server {
			return m
		}
	}
	m := s.resolve(server)
	list = append(list[:len(list):len(list)], m)
	s.servers.Store(&list)
	return m
}

func (s *metricsSet) resolve(server string) *serverMetrics {
	m := &serverMetrics{
		server:   server,
		requests: cacheRequests.WithLabelValues(server, s.zones, s.view),
		misses:   cacheMisses.WithLabelValues(server, s.zones, s.view),
		drops:    cacheDrops.WithLabelValues(server, s.zones, s.view),
		refused:  cacheRefused.WithLabelValues(server, s.zones, s.view),
		prefetch: cachePrefetches.WithLabelValues(server, s.zones, s.view),
		stale:    servedStale.WithLabelValues(server, s.zones, s.view),
		bytes:    cacheBytes.WithLabelValues(server, s.zones, s.view),
		capacity: cacheCapacity.WithLabelValues(server, s.zones, s.view),
		variants: ecsVariants.WithLabelValues(server, s.zones, s.view),
	}
	for k, t := range kindLabels {
		m.hits[k] = cacheHits.WithLabelValues(server, t, s.zones, s.view)
		m.evictions[k] = evictions.WithLabelValues(server, t, s.zones, s.view)
		m.entries[k] = cacheSize.WithLabelValues(server, t, s.zones, s.view)
	}
	return m
}

// stored updates the gauges and eviction counters after a store.
func (m *serverMetrics) stored(s *store, evicted perKind) {
	for k := range kindLabels {
		n := evicted[k]
		if n > 0 {
			m.evictions[k].Add(float64(n))
		}
		m.entries[k].Set(float64(s.entries[k].Load()))
	}
	m.bytes.Set(float64(s.bytes.Load()))
	m.capacity.Set(float64(s.capacity))
	m.variants.Set(float64(s.variants.Load()))
}

// frontendMetrics are a front end's counters, resolved for its server.
type frontendMetrics struct {
	hits, chain, shed, dropped prometheus.Counter
}

func (s *metricsSet) frontend(server string) frontendMetrics {
	of := func(result string) prometheus.Counter {
		return frontendRequests.WithLabelValues(server, s.zones, s.view, result)
	}
	return frontendMetrics{hits: of("hit"), chain: of("chain"), shed: of("shed"), dropped: of("dropped")}
}
