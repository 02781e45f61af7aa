package compactcache

import (
	"sync"
	"sync/atomic"
	"weak"

	"github.com/compactcache/compactcache/internal/store"
	"github.com/coredns/coredns/plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The families of the stock cache, under coredns_compactcache_ and with the
// same labels, plus the byte budget's and ECS's.
var (
	cacheSize = storeGauge("entries", kindedLabels,
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
	notAdmitted = counterVec("not_admitted_total", kindedLabels,
		"The count of entries dropped from probation without being asked for again there: refused admission to the main queue, not counted in evictions_total.")
	cacheBytes = storeGauge("bytes", blockLabels,
		"The bytes the cache holds: arenas, index and bookkeeping.")
	cacheCapacity = storeGauge("capacity_bytes", blockLabels,
		"The byte budget of the cache.")
	cachePrefetches = counterVec("prefetch_total", blockLabels,
		"The number of times the cache has prefetched a cached item.")
	servedStale = counterVec("served_stale_total", blockLabels,
		"The number of requests served from stale cache entries.")
	ecsVariants = storeGauge("ecs_variants", blockLabels,
		"The number of entries tailored to a client subnet (EDNS Client Subnet).")
	cacheRefused = counterVec("refused_total", blockLabels,
		"The number of responses not cached because they exceed the per-entry limit.")
	frontendRequests = counterVec("frontend_requests_total", resultLabels,
		"The requests the front end read, by result: hit (answered from the cache), chain (handed to the server block), shed (dropped: the chain had too many in flight), dropped (unreadable, cut by the socket buffer, or a reply the kernel refused to send).")
)

// The labels of the stock cache's families: per block, and per kind of entry.
var (
	blockLabels  = []string{"server", "zones", "view"}
	kindedLabels = []string{"server", "type", "zones", "view"}
	resultLabels = []string{"server", "zones", "view", "result"}
)

// storeGauge makes a gauge family that describes stores; storeGauges
// registers and sets it.
func storeGauge(name string, labels []string, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: plugin.Namespace, Subsystem: pluginName, Name: name, Help: help}, labels)
}

func counterVec(name string, labels []string, help string) *prometheus.CounterVec {
	return promauto.NewCounterVec(prometheus.CounterOpts{Namespace: plugin.Namespace, Subsystem: pluginName, Name: name, Help: help}, labels)
}

// Type label values, as the stock cache's.
var kindLabels = [...]string{store.KindSuccess: "success", store.KindDenial: "denial"}

// serverMetrics holds one server's resolved metrics, so that the hit path
// does not hash label values on every request.
type serverMetrics struct {
	server    string
	store     weak.Pointer[store.Store] // what the gauges describe; see storeGauges
	requests  prometheus.Counter
	misses    prometheus.Counter
	drops     prometheus.Counter
	refused   prometheus.Counter
	prefetch  prometheus.Counter
	stale     prometheus.Counter
	hits      [2]prometheus.Counter
	evictions [2]prometheus.Counter
	refusals  [2]prometheus.Counter
	entries   [2]prometheus.Gauge
	bytes     prometheus.Gauge
	capacity  prometheus.Gauge
	variants  prometheus.Gauge
}

// metricsSet maps servers to their metrics. A block serves few servers, so a
// copy-on-write slice scanned linearly beats a map and allocates nothing.
type metricsSet struct {
	c           *Cache // whose store the gauges describe
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
	storeGauges.add(m)
	return m
}

func (s *metricsSet) resolve(server string) *serverMetrics {
	m := &serverMetrics{
		server:   server,
		store:    weak.Make(s.c.store), // takeOver (OnStartup) is over: requests have come
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
		m.refusals[k] = notAdmitted.WithLabelValues(server, t, s.zones, s.view)
		m.entries[k] = cacheSize.WithLabelValues(server, t, s.zones, s.view)
	}
	return m
}

// evicted counts the entries a store dropped for room: evicted, and
// refused admission.
func (m *serverMetrics) evicted(d store.Dropped) {
	for k := range kindLabels {
		if n := d.Evicted[k]; n > 0 {
			m.evictions[k].Add(float64(n))
		}
		if n := d.Refused[k]; n > 0 {
			m.refusals[k].Add(float64(n))
		}
	}
}

// storeGauges sets the gauges of every server's store when the metrics are
// gathered, instead of on every insert, where setting them was five atomic
// stores in a miss that should take a microsecond.
var storeGauges = func() *storeCollector {
	sc := &storeCollector{}
	prometheus.MustRegister(sc)
	return sc
}()

// storeCollector collects the store gauge families, set from the stores of
// the servers that have had requests. A server's gauges are those of the
// instance that saw requests last, as when inserts set them: on reload the
// new instance comes after the old one. The stores are held weakly, so that a
// cache dropped by a reload goes, and its server with it.
type storeCollector struct {
	mu      sync.Mutex
	servers []*serverMetrics // in the order of their first request
}

func (sc *storeCollector) add(m *serverMetrics) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.prune()
	sc.servers = append(sc.servers, m)
}

// prune drops the servers whose store is gone. The caller holds sc.mu.
func (sc *storeCollector) prune() {
	live := sc.servers[:0]
	for _, m := range sc.servers {
		if m.store.Value() != nil {
			live = append(live, m)
		}
	}
	clear(sc.servers[len(live):])
	sc.servers = live
}

func (sc *storeCollector) vecs() [4]*prometheus.GaugeVec {
	return [...]*prometheus.GaugeVec{cacheSize, cacheBytes, cacheCapacity, ecsVariants}
}

// Describe implements prometheus.Collector.
func (sc *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range sc.vecs() {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (sc *storeCollector) Collect(ch chan<- prometheus.Metric) {
	sc.mu.Lock()
	sc.prune()
	for _, m := range sc.servers {
		s := m.store.Value()
		if s == nil {
			continue // gone since prune
		}
		u := s.Usage()
		for k := range kindLabels {
			m.entries[k].Set(float64(u.Kinds[k]))
		}
		m.bytes.Set(float64(u.Held))
		m.capacity.Set(float64(s.Capacity()))
		m.variants.Set(float64(u.Variants))
	}
	// Collected under the lock, so that a concurrent gathering does not
	// interleave its values with these.
	for _, v := range sc.vecs() {
		v.Collect(ch)
	}
	sc.mu.Unlock()
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
