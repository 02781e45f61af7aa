package compactcache

import (
	"context"
	"runtime"
	"testing"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// gauge gathers the default registry, as the prometheus plugin does, and
// returns the value of family for server (and kind, for the kinded
// families), or -1 when it has none.
func gauge(t *testing.T, family, server, kind string) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "coredns_compactcache_"+family {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				switch {
				case l.GetName() == "server" && l.GetValue() != server,
					l.GetName() == "type" && l.GetValue() != kind:
					continue metrics
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestStoreGaugesAtGathering: the gauges that describe the store are read
// from it when the metrics are gathered, and say what it holds then.
func TestStoreGaugesAtGathering(t *testing.T) {
	const server = "gauges://at-gathering"
	ctx := context.WithValue(context.Background(), dnsserver.Key{}, &dnsserver.Server{Addr: server})
	c := newTestCache(t, exampleUpstream(), newClock())
	for i, q := range []test.Case{{Qname: "a.example.org.", Qtype: dns.TypeA}, {Qname: "t.example.org.", Qtype: dns.TypeTXT}} {
		if _, err := c.ServeDNS(ctx, &recorder{}, q.Msg()); err != nil {
			t.Fatal(err)
		}
		st := c.Stats()
		if got := gauge(t, "entries", server, "success"); got != float64(i+1) || st.Entries != int64(i+1) {
			t.Fatalf("after %d misses: entries gauge %v, store %d", i+1, got, st.Entries)
		}
		if got := gauge(t, "bytes", server, ""); got != float64(st.Bytes) {
			t.Fatalf("bytes gauge %v, store %d", got, st.Bytes)
		}
		if got := gauge(t, "capacity_bytes", server, ""); got != defaultCapacity {
			t.Fatalf("capacity gauge %v, want %d", got, defaultCapacity)
		}
	}
	// A cache that is gone is no longer read: its store is not kept alive
	// by the collector, and its server leaves the collector's list.
	c = nil
	for range 3 {
		runtime.GC()
	}
	gauge(t, "entries", server, "success")
	storeGauges.mu.Lock()
	defer storeGauges.mu.Unlock()
	for _, m := range storeGauges.servers {
		if m.server == server {
			t.Fatal("the collector still reads the store of a cache that is gone")
		}
	}
}
