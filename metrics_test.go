package compactcache

import (
	"context"
	"fmt"
	"maps"
	"net"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/cachemetrics"
	"github.com/compactcache/compactcache/internal/config"
	"github.com/compactcache/compactcache/internal/store"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

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
		for _, name := range []string{"coredns_cache_entries", "coredns_compactcache_entries"} {
			if got := seriesValue(t, name, map[string]string{"server": server, "type": "success"}); got != float64(i+1) || st.Entries != int64(i+1) {
				t.Fatalf("after %d misses: %s %v, store %d", i+1, name, got, st.Entries)
			}
		}
		if got := seriesValue(t, "coredns_compactcache_bytes", map[string]string{"server": server}); got != float64(st.Bytes) {
			t.Fatalf("bytes gauge %v, store %d", got, st.Bytes)
		}
		if got := seriesValue(t, "coredns_compactcache_capacity_bytes", map[string]string{"server": server}); got != config.DefaultCapacity {
			t.Fatalf("capacity gauge %v, want %d", got, config.DefaultCapacity)
		}
	}
}

// TestMetricsStockFamilies runs the stock cache in one block and compactcache
// in another, in one process, with prometheus on one address: each stock
// family is exported once, fed by both blocks, and compactcache's own are
// exported beside them.
func TestMetricsStockFamilies(t *testing.T) {
	logs := testenv.CaptureLog(t) // not parallel
	const zone = "metrics.test."
	u := upstreamOfA(zone)
	u.add("nx."+zone, dns.TypeA, dns.RcodeNameError, nil, []dns.RR{test.SOA(zone + " 300 IN SOA ns." + zone + " admin." + zone + " 1 7200 3600 1209600 60")}, nil)
	up := startUpstream(t, u)
	blocks := []struct{ cache, server string }{{cache: "cache"}, {cache: "compactcache"}}
	// Ports of their own: the other tests' servers, all on port 0, count in
	// the same families.
	addrs, inst, _ := startOnFreePorts(t, 3, func(addrs []string) string {
		var corefile strings.Builder
		for i := range blocks {
			_, port, _ := net.SplitHostPort(addrs[i+1])
			fmt.Fprintf(&corefile, "%s:%s {\n\tbind 127.0.0.1\n\tprometheus %s\n\t%s\n\tforward . %s\n}\n",
				zone, port, addrs[0], blocks[i].cache, up)
		}
		return corefile.String()
	}, nil)
	t.Cleanup(func() { stopInstance(inst) })
	promAddr := addrs[0]
	for i := range blocks {
		blocks[i].server = "dns://" + addrs[i+1]
	}
	if _, err := cachemetrics.Register(); err != nil {
		t.Fatal(err)
	}

	// A miss and a hit of each kind: 4 requests, 2 misses, a hit and an
	// entry of each type.
	for _, b := range blocks {
		for _, q := range []string{"a." + zone, "a." + zone, "nx." + zone, "nx." + zone} {
			exchangeUDP(t, strings.TrimPrefix(b.server, "dns://"), test.Case{Qname: q, Qtype: dns.TypeA}.Msg())
		}
	}
	if n := u.count("a."+zone, dns.TypeA) + u.count("nx."+zone, dns.TypeA); n != 4 {
		t.Fatalf("the upstream was asked %d times, want 2 per block", n)
	}

	families := scrapeFamilies(t, "http://"+promAddr+"/metrics")
	want := []struct {
		name  string
		kind  string
		value float64
	}{
		{"requests_total", "", 4},
		{"misses_total", "", 2},
		{"hits_total", "success", 1},
		{"hits_total", "denial", 1},
		{"entries", "success", 1},
		{"entries", "denial", 1},
		{"drops_total", "", 0},
		{"prefetch_total", "", 0},
		{"served_stale_total", "", 0},
		{"evictions_total", "success", 0},
	}
	for _, w := range want {
		stock, own := "coredns_cache_"+w.name, "coredns_compactcache_"+w.name
		if f := families[stock]; f == nil || f.help != 1 || f.typ != 1 {
			t.Errorf("%s: %+v, want one HELP and one TYPE line", stock, f)
		}
		for _, b := range blocks {
			if w.value == 0 && b.cache == "cache" {
				continue // the stock cache makes a series when it first counts
			}
			labels := map[string]string{"server": b.server, "zones": zone, "view": ""}
			if w.kind != "" {
				labels["type"] = w.kind
			}
			if got, ok := families.value(stock, labels); !ok || got != w.value {
				t.Errorf("%s %v of the %s block: %v (found %t), want %v", stock, labels, b.cache, got, ok, w.value)
			}
			if b.cache == "compactcache" {
				if got, ok := families.value(own, labels); !ok || got != w.value {
					t.Errorf("%s %v: %v (found %t), want %v", own, labels, got, ok, w.value)
				}
			}
		}
	}
	for _, name := range []string{"bytes", "capacity_bytes", "refused_total", "ecs_variants"} {
		if f := families["coredns_compactcache_"+name]; f == nil || len(f.series) == 0 {
			t.Errorf("coredns_compactcache_%s not exported", name)
		}
	}
	if l := logs.String(); strings.Contains(strings.ToLower(l), "regist") || strings.Contains(l, "[ERROR]") {
		t.Errorf("the log names an error:\n%s", l)
	}
}

// scraped are the families of a scrape in the text format, by name.
type scraped map[string]*scrapedFamily

type scrapedFamily struct {
	help, typ int // HELP and TYPE lines
	series    []scrapedSeries
}

type scrapedSeries struct {
	labels map[string]string
	value  float64
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$`)
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// scrapeFamilies gets url in the text format, which a registry that failed
// to gather answers with an error status.
func scrapeFamilies(t *testing.T, url string) scraped {
	t.Helper()
	code, body := testenv.Get(t, url)
	if code != 200 {
		t.Fatalf("GET %s: %d\n%s", url, code, body)
	}
	out := scraped{}
	family := func(name string) *scrapedFamily {
		if out[name] == nil {
			out[name] = &scrapedFamily{}
		}
		return out[name]
	}
	for line := range strings.Lines(string(body)) {
		line = strings.TrimSuffix(line, "\n")
		switch f := strings.Fields(line); {
		case len(f) >= 3 && f[0] == "#" && f[1] == "HELP":
			family(f[2]).help++
		case len(f) >= 3 && f[0] == "#" && f[1] == "TYPE":
			family(f[2]).typ++
		case line == "" || f[0] == "#":
		default:
			m := sampleLine.FindStringSubmatch(line)
			if m == nil {
				t.Fatalf("scrape: line %q", line)
			}
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				t.Fatalf("scrape: line %q: %v", line, err)
			}
			s := scrapedSeries{labels: map[string]string{}, value: v}
			for _, l := range labelPair.FindAllStringSubmatch(m[2], -1) {
				s.labels[l[1]] = l[2]
			}
			fam := family(m[1])
			fam.series = append(fam.series, s)
		}
	}
	return out
}

// value returns the value of name's series with exactly these labels.
func (s scraped) value(name string, labels map[string]string) (float64, bool) {
	if f := s[name]; f != nil {
		for _, series := range f.series {
			if maps.Equal(series.labels, labels) {
				return series.value, true
			}
		}
	}
	return 0, false
}

// TestMetricsAsStock runs scenarios against the stock cache and against
// compactcache, as the differential test does, and compares what each
// counted in the stock families that dashboards divide by each other:
// requests, hits by type, misses, served_stale, prefetch and drops. The
// zones are the scenarios' own, so that their series are no other test's.
func TestMetricsAsStock(t *testing.T) {
	const zones = "example.org. metrics-as-stock.test."
	label := strings.ReplaceAll(zones, ". ", ".,")
	scenarios := []diffScenario{
		{name: "hits and misses", corefile: zones, steps: []diffStep{
			{ask: "a.example.org. A"}, {ask: "a.example.org. A"},
			{ask: "nx.example.org. A"}, {ask: "nx.example.org. A"},
			{ask: "sub.example.org. A"}, {ask: "sub.example.org. A"},
			{ask: "fail.example.org. A"}, {ask: "fail.example.org. A"},
			{ask: "down.example.org. A"}, {ask: "down.example.org. A"},
			{ask: "spoof.example.org. A"}, {ask: "spoof.example.org. A"},
		}},
		// Answers to the question that are not cached (RFC 2308 5): no drops.
		{name: "not cached", corefile: zones, steps: []diffStep{
			{ask: "dangling.example.org. A"}, {ask: "dangling.example.org. A"},
			{set: "nosoa.example.org. A", to: diffAnswer{rcode: dns.RcodeNameError}},
			{ask: "nosoa.example.org. A"}, {ask: "nosoa.example.org. A"},
		}},
		// Passed on untouched, each asked once: the stock cache may answer
		// them again from what it stored.
		{name: "passed on", corefile: zones, steps: []diffStep{
			{ask: "a.example.org. A 2q"}, {ask: "nx.example.org. A badecs"}, {ask: "example.org. AXFR"}, {ask: "example.org. IXFR"},
		}},
		{name: "servfail under a second", corefile: zones + " {\n servfail 500ms\n serve_stale 1h immediate 0s 0s\n}", steps: []diffStep{
			{ask: "fail.example.org. A"}, {ask: "fail.example.org. A"}, {advance: 10 * time.Second, ask: "fail.example.org. A"},
		}},
		{name: "serve_stale immediate", corefile: zones + " {\n serve_stale 1h immediate 0s 0s\n}", steps: []diffStep{
			{ask: "short.example.org. A"},
			{advance: 31 * time.Second, ask: "short.example.org. A"},
			{ask: "short.example.org. A"},
		}},
		{name: "serve_stale verify", corefile: zones + " {\n serve_stale 1h verify\n}", steps: []diffStep{
			{ask: "short.example.org. A"},
			// Verified: the upstream answers.
			{advance: 31 * time.Second, ask: "short.example.org. A"},
			{ask: "short.example.org. A"},
			// Not verified: the stale entry answers.
			{set: "short.example.org. A", to: diffAnswer{fail: true}},
			{advance: 31 * time.Second, ask: "short.example.org. A"},
		}},
		{name: "serve_stale_policy prefer_positive", corefile: zones + " {\n serve_stale 1h immediate 0s 0s\n serve_stale_policy prefer_positive\n}", steps: []diffStep{
			{ask: "short.example.org. A"},
			{set: "short.example.org. A", to: diffAnswer{rcode: dns.RcodeNameError, ns: []string{diffSOA}}},
			{advance: 31 * time.Second, ask: "short.example.org. A"},
			{ask: "short.example.org. A"},
		}},
		{name: "prefetch", corefile: zones + " {\n prefetch 2 1m 50%\n}", steps: []diffStep{
			{ask: "pop.example.org. A"},
			{advance: 10 * time.Second, ask: "pop.example.org. A"},
			{advance: 45 * time.Second, ask: "pop.example.org. A"},
			{advance: time.Second, ask: "pop.example.org. A"},
		}},
	}
	families := []struct{ name, kind string }{
		{"requests_total", ""}, {"hits_total", "success"}, {"hits_total", "denial"}, {"misses_total", ""},
		{"served_stale_total", ""}, {"prefetch_total", ""}, {"drops_total", ""},
	}
	counts := func() []float64 {
		var v []float64
		for _, f := range families {
			labels := map[string]string{"server": "", "zones": label, "view": ""}
			if f.kind != "" {
				labels["type"] = f.kind
			}
			v = append(v, seriesValue(t, "coredns_cache_"+f.name, labels))
		}
		return v
	}
	baseline := backgroundGoroutines(nil)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			var counted [2][]float64
			for i, directive := range []string{"cache", pluginName} {
				before := counts()
				runScenario(t, sc, directive, false, baseline)
				counted[i] = counts()
				for j := range counted[i] {
					counted[i][j] -= before[j]
				}
			}
			asks := 0
			for _, st := range sc.steps {
				if st.ask != "" {
					asks++
				}
			}
			if counted[0][0] != float64(asks) {
				t.Fatalf("the stock cache counted %v requests of %d: the series read are not the scenario's", counted[0][0], asks)
			}
			for j, f := range families {
				if counted[0][j] != counted[1][j] {
					t.Errorf("coredns_cache_%s{type=%q}: the stock cache counted %v, compactcache %v", f.name, f.kind, counted[0][j], counted[1][j])
				}
			}
		})
	}
}

// TestMetricsEntriesAcrossSwitch switches a block from the stock cache to
// compactcache and back by reloads, as a rollout does: coredns_cache_entries
// counts what the block's live cache holds, not that plus what the cache it
// replaced held when it went.
func TestMetricsEntriesAcrossSwitch(t *testing.T) {
	const zone = "metrics-switch.test."
	u := newUpstream()
	for _, name := range []string{"a", "b", "c"} {
		u.add(name+"."+zone, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(name + "." + zone + " 300 IN A 192.0.2.1")}, nil, nil)
	}
	up := startUpstream(t, u)
	if _, err := cachemetrics.Register(); err != nil {
		t.Fatal(err)
	}
	corefile := func(cache string) string {
		return ".:0 {\n\tbind 127.0.0.1\n\t" + cache + " " + zone + "\n\tforward . " + up + "\n}\n"
	}
	entries := func() float64 {
		return seriesValue(t, "coredns_cache_entries", map[string]string{"zones": zone, "type": "success"})
	}
	inst, err := startCorefile(corefile("cache"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopInstance(inst) }()
	for i, step := range []struct {
		cache string
		names []string // asked after the reload
	}{
		{"cache", []string{"a", "b", "c"}},
		{"compactcache", []string{"a"}},
		{"cache", []string{"a", "b"}},
	} {
		if i > 0 {
			serverMu.Lock()
			inst, err = inst.Restart(corefileInput(corefile(step.cache)))
			serverMu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
		}
		addr := inst.Servers()[0].LocalAddr().String()
		for _, name := range step.names {
			exchangeUDP(t, addr, test.Case{Qname: name + "." + zone, Qtype: dns.TypeA}.Msg())
		}
		// The store of a compactcache replaced goes at a collection; the
		// cleanup that tells the collector runs on a goroutine of its own.
		want, got := float64(len(step.names)), 0.0
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			runtime.GC()
			if got = entries(); got == want {
				break
			}
		}
		if got != want {
			t.Errorf("%s, %v entries: coredns_cache_entries %v", step.cache, want, got)
		}
	}
}

// TestMetricsEntriesAfterZonesReload reloads a block with other ZONES and
// settings that keep its store: coredns_cache_entries counts the store's
// entries once, under the zones of the live instance, not once more under
// those of each instance that had it before.
func TestMetricsEntriesAfterZonesReload(t *testing.T) {
	const zone = "metrics-rezone.test."
	u := newUpstream()
	for _, name := range []string{"a", "b", "c"} {
		u.add(name+"."+zone, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A(name + "." + zone + " 300 IN A 192.0.2.1")}, nil, nil)
	}
	up := startUpstream(t, u)
	if _, err := cachemetrics.Register(); err != nil {
		t.Fatal(err)
	}
	corefile := func(zones string) string {
		return ".:0 {\n\tbind 127.0.0.1\n\tcompactcache " + zones + "\n\tforward . " + up + "\n}\n"
	}
	steps := []struct {
		zones string // the block's ZONES
		label string // their zones label
		ask   string // the name asked after the (re)load
	}{
		{zone, zone, "a"},
		{zone + " one.metrics-rezone.test", zone + ",one.metrics-rezone.test.", "b"},
		{zone + " two.metrics-rezone.test", zone + ",two.metrics-rezone.test.", "c"},
	}
	inst, err := startCorefile(corefile(steps[0].zones))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopInstance(inst) }()
	for i, step := range steps {
		if i > 0 {
			serverMu.Lock()
			inst, err = inst.Restart(corefileInput(corefile(step.zones)))
			serverMu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
		}
		exchangeUDP(t, inst.Servers()[0].LocalAddr().String(), test.Case{Qname: step.ask + "." + zone, Qtype: dns.TypeA}.Msg())
		for j, other := range steps {
			got := seriesValue(t, "coredns_cache_entries", map[string]string{"zones": other.label, "type": "success"})
			want := 0.0
			if j == i {
				want = float64(i + 1) // the store is handed over: every name asked so far
			}
			if got != want {
				t.Errorf("after the reload to %q: coredns_cache_entries{zones=%q} %v, want %v", step.zones, other.label, got, want)
			}
		}
	}
}

// TestMetricsEvictionsCounted fills a small store past its budget: every
// entry stored is still held, or counted in evictions_total or
// not_admitted_total, also where ECS answers bring each name a list of its
// variants, whose insertion makes room as an entry's does.
func TestMetricsEvictionsCounted(t *testing.T) {
	const names = 40000
	for _, tc := range []struct {
		server string
		subnet string // the clients' ECS, "" for none
	}{
		{"evictions://no-ecs", ""},
		{"evictions://ecs", "10.1.2.0/24"},
	} {
		ctx := context.WithValue(context.Background(), dnsserver.Key{}, &dnsserver.Server{Addr: tc.server})
		c := newGeoCache(t, "compactcache {\n capacity 1MiB\n}", newGeoUpstream(), newClock())
		for i := range names {
			if _, err := c.ServeDNS(ctx, &recorder{}, geoQuery(fmt.Sprintf("s16.n%d.geo.", i), tc.subnet)); err != nil {
				t.Fatal(err)
			}
		}
		held := c.store.Usage().Kinds[store.KindSuccess]
		labels := map[string]string{"server": tc.server, "type": "success"}
		evicted := seriesValue(t, "coredns_cache_evictions_total", labels)
		refused := seriesValue(t, "coredns_compactcache_not_admitted_total", labels)
		if evicted+refused == 0 || float64(held)+evicted+refused != names {
			t.Errorf("%s: %d entries stored: %d held, %v evicted, %v not admitted", tc.server, names, held, evicted, refused)
		}
	}
}
