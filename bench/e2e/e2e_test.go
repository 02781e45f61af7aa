//go:build linux

package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
)

func TestSumMetric(t *testing.T) {
	text := `# HELP coredns_dns_requests_total Counter of DNS requests made per zone, protocol and family.
# TYPE coredns_dns_requests_total counter
coredns_dns_requests_total{family="1",proto="udp",server="dns://:53",type="A",view="",zone="."} 1.5e+06
coredns_dns_requests_total{family="1",proto="udp",server="dns://:53",type="TXT",view="",zone="."} 42
coredns_dns_requests_total_other 7
`
	if got := sumMetric(text, "coredns_dns_requests_total"); got != 1_500_042 {
		t.Errorf("sumMetric = %d", got)
	}
}

func TestCorefiles(t *testing.T) {
	p := newPorts(15300)
	cs := cacheSpec{capacity: "256MiB", success: 300000}
	want := map[string][]string{
		kindWhoami:               {"whoami"},
		kindCompact:              {"compactcache {", "capacity 256MiB", "forward . 127.0.0.1:15301"},
		kindFrontend:             {"compactcache {", "capacity 256MiB", "frontend 127.0.0.1:15300\n", "forward . 127.0.0.1:15301"},
		kindStock:                {"cache {", "success 300000", "forward . 127.0.0.1:15301"},
		kindKubeCompact:          {"errors", "health 127.0.0.1:15303", "ready 127.0.0.1:15304", "prometheus 127.0.0.1:15305", "max_concurrent 1000", "compactcache 3600 {", "disable success cluster.local", "loop", "reload", "loadbalance"},
		kindKubeStock:            {"cache 3600 {", "success 300000", "loadbalance"},
		kindKubeWhoami:           {"prometheus 127.0.0.1:15305", "whoami", "loadbalance"},
		kindKubeFrontend:         {"prometheus 127.0.0.1:15305", "compactcache 3600 {", "frontend 127.0.0.1:15300 {", "inflight 1024", "loadbalance"},
		kindKubeFrontendNoProm:   {"compactcache 3600 {", "frontend 127.0.0.1:15300 {", "loadbalance"},
		kindKubeFrontendPoller:   {"prometheus 127.0.0.1:15305", "frontend 127.0.0.1:15300 {", "inflight 1024", "wait poller", "loadbalance"},
		kindKubeFrontendCoalesce: {"prometheus 127.0.0.1:15305", "frontend 127.0.0.1:15300 {", "inflight 1024", "coalesce 200us", "loadbalance"},
	}
	for _, k := range kinds {
		if k == kindUnbound {
			if _, err := corefile(k, p, cs, false); err == nil {
				t.Error("a Corefile for unbound")
			}
			continue
		}
		text, err := corefile(k, p, cs, false)
		if err != nil {
			t.Fatal(err)
		}
		// The front end takes dnsperf's port; the block listens on another.
		listen := ".:15300 {\n"
		if hasFrontend(k) {
			listen = ".:15307 {\n"
		}
		if k != kindKubeFrontendPoller && strings.Contains(text, "wait poller") {
			t.Errorf("%s: waits in the poller:\n%s", k, text)
		}
		if k != kindKubeFrontendCoalesce && strings.Contains(text, "coalesce") {
			t.Errorf("%s: coalesces:\n%s", k, text)
		}
		if k == kindKubeFrontendNoProm && strings.Contains(text, "prometheus") {
			t.Errorf("%s: has prometheus:\n%s", k, text)
		}
		if !strings.HasPrefix(text, listen+"    bind 127.0.0.1\n") || strings.Count(text, "{") != strings.Count(text, "}") {
			t.Errorf("%s:\n%s", k, text)
		}
		for _, s := range want[k] {
			if !strings.Contains(text, s) {
				t.Errorf("%s: no %q in\n%s", k, s, text)
			}
		}
		if k == kindKubeWhoami && (strings.Contains(text, "forward") || strings.Contains(text, "cache")) {
			t.Errorf("%s: has forward or a cache:\n%s", k, text)
		}
		if strings.Contains(text, "pprof") {
			t.Errorf("%s: pprof without asking", k)
		}
		if text, _ := corefile(k, p, cs, true); !strings.Contains(text, "pprof 127.0.0.1:15306") {
			t.Errorf("%s: no pprof:\n%s", k, text)
		}
	}
	if _, err := corefile("nope", p, cs, false); err == nil {
		t.Error("unknown kind accepted")
	}
}

func TestUnboundConf(t *testing.T) {
	p := newPorts(15300)
	text := unboundConf(p, "/tmp/run", "/tmp/run/logs/unbound.server.unbound.log")
	// Each setting on a line of its own, under the clause it belongs to.
	clauses := map[string]map[string]string{}
	var clause string
	for _, line := range strings.Split(text, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if !strings.HasPrefix(line, " ") {
			clause = strings.TrimSuffix(line, ":")
			if clauses[clause] == nil {
				clauses[clause] = map[string]string{}
			}
			continue
		}
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok || clause == "" {
			t.Fatalf("line %q", line)
		}
		if _, dup := clauses[clause][k]; dup && k != "access-control" {
			t.Errorf("%s: %s twice", clause, k)
		}
		clauses[clause][k] = v
	}
	want := map[string]map[string]string{
		"server": {
			"interface": "127.0.0.1@15300", "port": "15300", "num-threads": "1", "so-reuseport": "no",
			"do-not-query-localhost": "no", "module-config": `"iterator"`, "chroot": `""`, "username": `""`,
			"logfile":        `"/tmp/run/logs/unbound.server.unbound.log"`,
			"access-control": "127.0.0.0/8 allow", "msg-cache-size": "256m", "rrset-cache-size": "256m",
			"cache-min-ttl": "0", "prefetch": "no", "serve-expired": "no",
		},
		"remote-control": {"control-enable": "no"},
		"forward-zone":   {"name": `"."`, "forward-addr": "127.0.0.1@15301", "forward-first": "no"},
	}
	for c, kv := range want {
		for k, v := range kv {
			if got := clauses[c][k]; got != v {
				t.Errorf("%s: %s: %q, want %q", c, k, got, v)
			}
		}
	}
	for _, k := range []string{"auto-trust-anchor-file", "trust-anchor-file", "trust-anchor", "root-hints"} {
		if _, ok := clauses["server"][k]; ok {
			t.Errorf("server: %s set: validation or iteration from the root", k)
		}
	}
}

func TestParseConfig(t *testing.T) {
	c, err := parseConfig("compact@GOGC=off,GOMEMLIMIT=256MiB")
	if err != nil || c.Kind != kindCompact || len(c.Env) != 2 || c.Env[1] != "GOMEMLIMIT=256MiB" {
		t.Errorf("%+v %v", c, err)
	}
	c, err = parseConfig("kube-compact@GOGC=200,rev=3e3a5a5")
	if err != nil || c.Kind != kindKubeCompact || c.Rev != "3e3a5a5" || len(c.Env) != 1 || c.Env[0] != "GOGC=200" {
		t.Errorf("%+v %v", c, err)
	}
	for _, bad := range []string{"cache", "compact@GOGC", "compact@=1", "compact@rev="} {
		if _, err := parseConfig(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestMedianAndPairs(t *testing.T) {
	mk := func(spec string, round int, qps float64) result {
		c, err := parseConfig(spec)
		if err != nil {
			t.Fatal(err)
		}
		return result{Round: round, Config: c, Max: &phase{Perf: harness.Perf{QPS: qps}}}
	}
	rep := &report{Options: map[string]string{"n": "10", "rates": "10000,2000"}, Results: []result{
		mk("compact", 1, 3), mk("stock", 1, 1), mk("compact@GOGC=400", 1, 5), mk("stock@GOGC=400", 1, 2),
		mk("compact", 2, 9), mk("stock", 2, 1), mk("compact", 3, 4),
	}}
	rep.Results = append(rep.Results, result{Round: 3, Config: config{Spec: "stock", Kind: kindStock}, Err: "failed"})
	g := rep.find("compact")
	if g == nil || len(g.rs) != 3 || g.med(figMax(qps)) != 4 {
		t.Fatalf("compact: %+v", g)
	}
	if m := rep.find("stock").med(figMax(qps)); m != 1 {
		t.Errorf("stock median %v", m)
	}
	ps := rep.pairs()
	if len(ps) != 2 || ps[0][1].spec != "stock" || ps[1][1].spec != "stock@GOGC=400" {
		t.Errorf("pairs %v", ps)
	}
	var out strings.Builder
	if err := rep.write(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| max hit q/s | 4.00 | 2.50 |") {
		t.Errorf("ratios missing:\n%s", out.String())
	}
}

func TestBesideUnbound(t *testing.T) {
	mk := func(spec string, qps float64, cpu time.Duration, p99 float64, rss int64) result {
		c, err := parseConfig(spec)
		if err != nil {
			t.Fatal(err)
		}
		return result{Round: 1, Config: c, RSSStart: 1000, RSSFill: 1000 + rss*10,
			Max:   &phase{Perf: harness.Perf{QPS: qps, Completed: 1000}, ServerCPU: cpu},
			Rates: []phase{{Rate: 30000, Perf: harness.Perf{Completed: 1000, Lat: &harness.Latency{N: 1000, P50: p99 / 2, P99: p99}}, ServerCPU: cpu}}}
	}
	rep := &report{Options: map[string]string{"n": "10", "rates": "30000"}, Results: []result{
		mk("frontend", 200_000, 3*time.Millisecond, 100, 500),
		mk("unbound", 100_000, 6*time.Millisecond, 50, 1000),
		mk("compact", 90_000, 9*time.Millisecond, 300, 500),
	}}
	var out strings.Builder
	if err := rep.write(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, s := range []string{
		"| figure | unbound | frontend | compact |",
		"| server µs per hit query at max | 6.00 | 3.00 (0.50) | 9.00 (1.50) |",
		"| max hit q/s | 100000 | 200000 (2.00) | 90000 (0.90) |",
		"| p99 µs at 30000/s | 50 | 100 (2.00) | 300 (6.00) |",
		"| RSS B/entry | 1000 | 500 (0.50) | 500 (0.50) |",
		"| server µs/q at 30000/s | 6.00 | 3.00 (0.50) | 9.00 (1.50) |",
		// frontend against the stock cache: absent here, so no pair.
	} {
		if !strings.Contains(text, s) {
			t.Errorf("no %q in\n%s", s, text)
		}
	}
	// Unbound has no Go heap and no GC: dashes, not zeros.
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "| unbound | 0.0 |") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 17 || cells[5] != "–" || cells[15] != "–" || cells[16] != "–" {
			t.Errorf("unbound row with Go figures (heap, GCs, GC µs/q): %s", line)
		}
	}
}

func TestParseMemStats(t *testing.T) {
	text := "heap profile: 1: 2 [3: 4] @ heap/1048576\n# runtime.MemStats\n# Alloc = 1234\n# HeapInuse = 8192\n# PauseNs = [1 2 3]\n# NumGC = 7\n"
	m := parseMemStats(text)
	if m["HeapInuse"] != 8192 || m["Alloc"] != 1234 || m["NumGC"] != 7 || len(m) != 3 {
		t.Errorf("%v", m)
	}
}

func TestParseGCLine(t *testing.T) {
	d, ok := parseGCLine("gc 7 @2.107s 1%: 0.011+1.2+0.003 ms clock, 0.011+0.15/0.90/0.21+0.003 ms cpu, 4->4->1 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 1 P")
	want := time.Duration((0.011 + 0.15 + 0.90 + 0.21 + 0.003) * float64(time.Millisecond))
	if !ok || d < want-time.Microsecond || d > want+time.Microsecond {
		t.Errorf("parseGCLine = %v, %v; want %v", d, ok, want)
	}
	if _, ok := parseGCLine("maxprocs: Leaving GOMAXPROCS=1"); ok {
		t.Error("not a gctrace line, but read as one")
	}
}

// TestWritePlot draws a run's fixed-rate phases, and refuses a run without
// any.
func TestWritePlot(t *testing.T) {
	mk := func(spec string, cpu time.Duration) result {
		c, err := parseConfig(spec)
		if err != nil {
			t.Fatal(err)
		}
		var rates []phase
		for _, q := range []int{2000, 10000, 30000} {
			rates = append(rates, phase{Rate: q, Perf: harness.Perf{Completed: 1000}, ServerCPU: cpu})
		}
		return result{Round: 1, Config: c, Max: &phase{Perf: harness.Perf{QPS: 1000, Completed: 1000}, ServerCPU: cpu}, Rates: rates}
	}
	rep := &report{Options: map[string]string{"n": "10", "rates": "2000,10000,30000", "duration": "10s"},
		Results: []result{mk("frontend", 20*time.Millisecond), mk("unbound", 30*time.Millisecond)}}
	path := filepath.Join(t.TempDir(), "cpu.png")
	if err := rep.writePlot(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("not a PNG: %v", err)
	}
	rep.Options["rates"] = ""
	if err := rep.writePlot(path); err == nil {
		t.Error("a run without fixed-rate phases plotted")
	}
}
