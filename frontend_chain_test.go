//go:build linux

package compactcache

import (
	"fmt"
	"math"
	"net"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// perRequestFamilies are the prometheus plugin's per-request series: what
// dashboards, alerts and autoscalers built for CoreDNS read.
var perRequestFamilies = []string{
	"coredns_dns_requests_total",
	"coredns_dns_responses_total",
	"coredns_dns_do_requests_total",
	"coredns_dns_request_duration_seconds",
	"coredns_dns_request_size_bytes",
	"coredns_dns_response_size_bytes",
}

// seriesOf sums, for every series of the per-request families in zone, its
// count (the value of a counter, the count of a histogram) and for the size
// histograms its sum, by family and labels; the server and zone labels are
// left out, so that two blocks can be compared.
func seriesOf(t *testing.T, zone string) (counts, sums map[string]float64) {
	t.Helper()
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts, sums = map[string]float64{}, map[string]float64{}
	for _, f := range families {
		if !contains(perRequestFamilies, f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			inZone := false
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "zone":
					inZone = l.GetValue() == zone
				case "server":
				default:
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
			}
			if !inZone {
				continue
			}
			sort.Strings(labels)
			k := f.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				counts[k] += m.GetCounter().GetValue()
			case dto.MetricType_HISTOGRAM:
				counts[k] += float64(m.GetHistogram().GetSampleCount())
				if strings.HasSuffix(f.GetName(), "_bytes") {
					sums[k] += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return counts, sums
}

// minus returns what each series of now adds to before, without the series
// that add nothing.
func minus(now, before map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range now {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestFrontendHitsCountedAsPluginHits sends one stream of queries (misses,
// hits, NXDOMAIN, NODATA, DO, CD, TCP, IPv6, a truncated answer) to a block
// in plugin mode and to a block served by a front end, in one instance, and
// compares what the prometheus plugin's per-request series say of each:
// the same counts in every series, the same sizes but for the few bytes
// that the order of compression changes. The front end must have answered
// the hits itself: one that handed everything to the chain fails.
func TestFrontendHitsCountedAsPluginHits(t *testing.T) {
	const chainZone, frontZone = "chain.metrics.test.", "front.metrics.test."
	u := newUpstream()
	for _, z := range []string{chainZone, frontZone} {
		soa := []dns.RR{test.SOA(z + " 300 IN SOA ns." + z + " admin." + z + " 1 7200 3600 1209600 60")}
		u.add("www."+z, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("www." + z + " 300 IN A 192.0.2.1")}, nil, nil)
		u.add("www."+z, dns.TypeAAAA, dns.RcodeSuccess, nil, soa, nil)
		u.add("nx."+z, dns.TypeA, dns.RcodeNameError, nil, soa, nil)
		var big []dns.RR
		for i := range 40 {
			big = append(big, test.TXT(fmt.Sprintf(`big.%s 300 IN TXT "record %02d of a set too large for 512 bytes"`, z, i)))
		}
		u.add("big."+z, dns.TypeTXT, dns.RcodeSuccess, big, nil, nil)
	}
	up := startUpstream(t, u)
	// The kube-dns Corefile's plugins around the cache: the metrics
	// recorder learns the plugin label of the plugin right after prometheus
	// (errors), and loadbalance wraps the writer too.
	block := func(zone, cache string) string {
		return zone + `:0 {
	bind 127.0.0.1 ::1
	errors
	prometheus 127.0.0.1:0
	loadbalance
	` + cache + `
	forward . ` + up + `
}
`
	}
	var fe6 string
	fes, inst, _ := startFrontends(t, 1, func(fes []string) string {
		_, port, _ := net.SplitHostPort(fes[0])
		fe6 = net.JoinHostPort("::1", port)
		return block(chainZone, "compactcache") + block(frontZone, "compactcache {\n\t\tfrontend "+fes[0]+" "+fe6+"\n\t}")
	})
	fe4 := fes[0]
	listeners := map[string]string{} // by family, the servers' own UDP and TCP addresses
	for _, s := range inst.Servers() {
		a := s.LocalAddr().String()
		if strings.HasPrefix(a, "[") {
			listeners["6"] = a
		} else {
			listeners["4"], listeners["4tcp"] = a, s.Addr().String()
		}
	}
	if listeners["4"] == "" || listeners["6"] == "" {
		t.Fatalf("servers %v: want one on 127.0.0.1 and one on ::1", listeners)
	}

	type query struct {
		name   string
		qtype  uint16
		do, cd bool
		tcp    bool
		v6     bool
		edns   bool
	}
	stream := []query{
		{name: "www", qtype: dns.TypeA, edns: true}, // the miss
		{name: "www", qtype: dns.TypeA, edns: true}, // hits from here on, but where noted
		{name: "www", qtype: dns.TypeA, edns: true, do: true},
		{name: "www", qtype: dns.TypeA, edns: true, cd: true}, // a miss: CD has entries of its own
		{name: "www", qtype: dns.TypeA, edns: true, cd: true},
		{name: "nx", qtype: dns.TypeA}, // a miss
		{name: "nx", qtype: dns.TypeA},
		{name: "www", qtype: dns.TypeAAAA}, // a miss: NODATA
		{name: "www", qtype: dns.TypeAAAA},
		{name: "www", qtype: dns.TypeA, tcp: true},
		{name: "www", qtype: dns.TypeA, v6: true},
		{name: "big", qtype: dns.TypeTXT}, // a miss, asked again over TCP upstream
		{name: "big", qtype: dns.TypeTXT}, // a hit, truncated to 512 bytes
	}
	const wantHits = 8
	ask := func(zone string, front bool) {
		for i, q := range stream {
			m := new(dns.Msg).SetQuestion(q.name+"."+zone, q.qtype)
			m.CheckingDisabled = q.cd
			if q.edns || q.do {
				m.SetEdns0(1232, q.do)
			}
			addr := listeners["4"]
			switch {
			case front && q.v6:
				addr = fe6
			case front:
				addr = fe4
			case q.v6:
				addr = listeners["6"]
			case q.tcp:
				addr = listeners["4tcp"]
			}
			var r *dns.Msg
			if q.tcp {
				r = exchangeTCP(t, addr, m)
			} else {
				r, _ = exchangeUDP(t, addr, m)
			}
			if want := map[string]int{"nx": dns.RcodeNameError}[q.name]; r.Rcode != want {
				t.Fatalf("%s query %d: rcode %s", zone, i, dns.RcodeToString[r.Rcode])
			}
			if q.name == "big" && !r.Truncated {
				t.Fatalf("%s query %d: the large answer came whole over UDP", zone, i)
			}
		}
	}
	hits := frontendCount(frontZone, "hit")
	// The series outlive the test (-count): what it adds is compared.
	chain0, chainSums0 := seriesOf(t, chainZone)
	front0, frontSums0 := seriesOf(t, frontZone)
	ask(chainZone, false)
	ask(frontZone, true)
	if got := frontendHits(frontZone, hits, wantHits); got != wantHits {
		t.Errorf("the front end answered %v hits itself, want %d", got, wantHits)
	}

	// The prometheus plugin counts a request once its reply is written,
	// which may be after the client has its reply and has gone on to the
	// next, in one series after another; and a gather reads the families
	// one after another too, so that one request may be in some families
	// of a gather and not yet in others. So the series are read until the
	// two modes agree, and what still differs at the deadline fails.
	var counted float64
	var differ []string
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		counted, differ = compareSeries(t, chainZone, frontZone, chain0, chainSums0, front0, frontSums0)
		if len(differ) == 0 && counted == float64(len(stream)) || time.Now().After(deadline) {
			break
		}
	}
	if counted != float64(len(stream)) {
		t.Fatalf("plugin mode: %v requests counted, want %d", counted, len(stream))
	}
	for _, d := range differ {
		t.Error(d)
	}
}

// compareSeries reads the per-request series of the two zones, less what
// they held before, and returns the responses counted in the plugin-mode
// zone and how the two zones' series differ: in counts, and in sizes by
// more than the few bytes a request that the order of compression changes
// between the two reply writers.
func compareSeries(t *testing.T, chainZone, frontZone string, chain0, chainSums0, front0, frontSums0 map[string]float64) (responses float64, differ []string) {
	t.Helper()
	chain, chainSums := seriesOf(t, chainZone)
	front, frontSums := seriesOf(t, frontZone)
	chain, chainSums, front, frontSums = minus(chain, chain0), minus(chainSums, chainSums0), minus(front, front0), minus(frontSums, frontSums0)
	for k, v := range chain {
		if strings.HasPrefix(k, "coredns_dns_responses_total{") {
			responses += v
		}
		if front[k] != v {
			differ = append(differ, fmt.Sprintf("%s: %v through the front end, %v in plugin mode", k, front[k], v))
		}
	}
	for k, v := range front {
		if _, ok := chain[k]; !ok {
			differ = append(differ, fmt.Sprintf("%s: %v through the front end, none in plugin mode", k, v))
		}
	}
	for k, v := range chainSums {
		if d := math.Abs(frontSums[k] - v); d > 8*chain[k] {
			differ = append(differ, fmt.Sprintf("%s: sum %v through the front end, %v in plugin mode", k, frontSums[k], v))
		}
	}
	return responses, differ
}

// TestFrontendHitsLoggedAsPluginHits sends one stream of queries to a block
// in plugin mode and to a block served by a front end, each with `log`, and
// compares the lines: the same lines but for the client's port, the ID and
// the duration. A rule's class filter holds for hits too, and a format with
// metadata, which only the chain can fill, sends every request there.
func TestFrontendHitsLoggedAsPluginHits(t *testing.T) {
	buf := testenv.CaptureLog(t)
	u := newUpstream()
	zones := []string{"chain.log.test.", "front.log.test.", "chain.den.test.", "front.den.test.", "front.meta.test."}
	for _, z := range zones {
		soa := []dns.RR{test.SOA(z + " 300 IN SOA ns." + z + " admin." + z + " 1 7200 3600 1209600 60")}
		u.add("www."+z, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("www." + z + " 300 IN A 192.0.2.1")}, nil, nil)
		u.add("www."+z, dns.TypeAAAA, dns.RcodeSuccess, nil, soa, nil)
		u.add("nx."+z, dns.TypeA, dns.RcodeNameError, nil, soa, nil)
	}
	up := startUpstream(t, u)
	fronts := map[string]string{}
	_, inst, corefile := startFrontends(t, 3, func(fes []string) string {
		corefile := ""
		for _, z := range zones {
			logs := "log"
			switch {
			case strings.Contains(z, ".den."):
				logs = "log . {\n\t\tclass denial\n\t}"
			case strings.Contains(z, ".meta."):
				logs = "metadata\n\tlog . \"{name} {/compactcache/none}\""
			}
			cache := "compactcache"
			if strings.HasPrefix(z, "front.") {
				fronts[z], fes = fes[0], fes[1:]
				cache = "compactcache {\n\t\tfrontend " + fronts[z] + "\n\t}"
			}
			corefile += z + ":0 {\n\tbind 127.0.0.1\n\t" + logs + "\n\t" + cache + "\n\tforward . " + up + "\n}\n"
		}
		return corefile
	})
	plain, _ := serverAddrs(t, inst, corefile)
	ask := func(zone string) {
		addr := plain
		if a, ok := fronts[zone]; ok {
			addr = a
		}
		for _, q := range []struct {
			name  string
			qtype uint16
		}{{"www", dns.TypeA}, {"www", dns.TypeA}, {"www", dns.TypeA}, {"nx", dns.TypeA}, {"nx", dns.TypeA}, {"www", dns.TypeAAAA}, {"www", dns.TypeAAAA}} {
			exchangeUDP(t, addr, new(dns.Msg).SetQuestion(q.name+"."+zone, q.qtype))
		}
	}
	hits := frontendCount("front.log.test.", "hit")
	for _, z := range zones {
		ask(z)
	}
	if got := frontendHits("front.log.test.", hits, 4); got != 4 {
		t.Errorf("the front end answered %v hits itself, want 4", got)
	}
	if got := frontendCount("front.meta.test.", "hit"); got != 0 {
		t.Errorf("the front end answered %v hits of a block whose log format has metadata, want none", got)
	}
	// client port, ID and duration differ; the zone's first label is the block's
	mask := regexp.MustCompile(`127\.0\.0\.1:\d+ - \d+ "|\S+s$|(chain|front)\.`)
	for _, pair := range [][2]string{{"chain.log.test.", "front.log.test."}, {"chain.den.test.", "front.den.test."}} {
		// Both write their lines after the reply: wait for them.
		var want, got []string
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			want, got = linesOf(buf.String(), pair[0], mask), linesOf(buf.String(), pair[1], mask)
			if len(want) > 0 && len(got) == len(want) || time.Now().After(deadline) {
				break
			}
		}
		if len(want) == 0 || strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("log lines of %s through the front end:\n%s\nin plugin mode:\n%s", pair[1], strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if n := len(linesOf(buf.String(), "chain.den.test.", mask)); n != 4 {
		t.Errorf("%d lines of the block that logs denials only, want 4 (two NXDOMAIN, two NODATA)", n)
	}
}

// TestFrontendLogsLargeRequests: with log before the cache, a hit whose
// request is past 512 bytes (a query padded over TCP, RFC 7830) is logged
// as the log plugin logs it; the front end dropped its line.
func TestFrontendLogsLargeRequests(t *testing.T) {
	buf := testenv.CaptureLog(t)
	const zone = "biglog.frontend.test."
	u := newUpstream()
	u.add("www."+zone, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("www." + zone + " 300 IN A 192.0.2.1")}, nil, nil)
	up := startUpstream(t, u)
	fe, _, _ := startFrontend(t, func(fe string) string {
		return zone + `:0 {
	bind 127.0.0.1
	log
	compactcache {
		frontend ` + fe + `
	}
	forward . ` + up + ` {
		force_tcp
	}
}`
	})
	m := new(dns.Msg).SetQuestion("www."+zone, dns.TypeA)
	m.SetEdns0(1232, false)
	m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_PADDING{Padding: make([]byte, 600)})
	exchangeTCP(t, fe, m) // the miss, logged by the chain's log
	hits := frontendCount(zone, "hit")
	exchangeTCP(t, fe, m)
	if got := frontendHits(zone, hits, 1); got != 1 {
		t.Fatalf("%v front end hits, want 1", got)
	}
	// The client port, ID and duration differ.
	mask := regexp.MustCompile(`127\.0\.0\.1:\d+ - \d+ "|\S+s$`)
	var lines []string
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if lines = linesOf(buf.String(), zone, mask); len(lines) == 2 {
			break
		}
	}
	if len(lines) != 2 || lines[0] != lines[1] {
		t.Errorf("log lines of the miss and the hit:\n%s\nwant two, the same", strings.Join(lines, "\n"))
	}
}

// TestFrontendLogsBufsize: with bufsize before the cache, the log plugin
// logs every request with the buffer size bufsize clamped it to
// ({>bufsize}), and the front end's lines of hits say the same; they said
// the client's.
func TestFrontendLogsBufsize(t *testing.T) {
	buf := testenv.CaptureLog(t)
	const zone = "bufsizelog.frontend.test."
	u := newUpstream()
	u.add("www."+zone, dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("www." + zone + " 300 IN A 192.0.2.1")}, nil, nil)
	up := startUpstream(t, u)
	fe, udp, _ := startFrontend(t, func(fe string) string {
		return zone + `:0 {
	bind 127.0.0.1
	bufsize 1232
	log
	compactcache {
		frontend ` + fe + `
	}
	forward . ` + up + `
}`
	})
	m := new(dns.Msg).SetQuestion("www."+zone, dns.TypeA)
	m.SetEdns0(4096, false)
	exchangeUDP(t, udp, m) // the miss
	exchangeUDP(t, udp, m) // a hit of the plugin
	hits := frontendCount(zone, "hit")
	exchangeUDP(t, fe, m) // a hit of the front end
	if got := frontendHits(zone, hits, 1); got != 1 {
		t.Fatalf("%v front end hits, want 1", got)
	}
	var lines []string
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if lines = linesOf(buf.String(), zone, regexp.MustCompile(`^$`)); len(lines) == 3 {
			break
		}
	}
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		if !strings.Contains(l, ` false 1232"`) {
			t.Errorf("log line without the clamped buffer size 1232:\n%s", l)
		}
	}
}

// linesOf returns the log plugin's lines for names in zone, masked with mask
// and sorted.
func linesOf(log, zone string, mask *regexp.Regexp) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if i := strings.Index(l, "127.0.0.1:"); i >= 0 && strings.Contains(l, "."+zone+" ") {
			out = append(out, mask.ReplaceAllString(l[i:], "-"))
		}
	}
	sort.Strings(out)
	return out
}
