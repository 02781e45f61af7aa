package frontend

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics/vars"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// runs numbers the servers the tests below count in. CoreDNS's request
// series are global to the process, so a test run again (-count=N) gets a
// server label of its own rather than find the last run's counts.
var runs atomic.Int64

// serverLabel returns a server label no other call in this process returned.
func serverLabel(name string) string {
	return fmt.Sprintf("dns://%s-%d:53", name, runs.Add(1))
}

// TestLabelsAsReport gives requests of every kind the labels labelsOf
// computes and vars.Report, which the prometheus plugin calls in plugin
// mode, and checks that Report counted each in exactly the series labelsOf
// names: zones (longest match, none, case), protocols, families (IPv4,
// IPv6, IPv4-mapped), monitored and other types, DO, and every rcode.
func TestLabelsAsReport(t *testing.T) {
	zoneNames := []string{"example.org.", "sub.example.org.", "cluster.local."}
	names := []string{"a.example.org.", "X.Sub.Example.ORG.", "sub.example.org.", "svc.cluster.local.", "elsewhere.net.", "."}
	view := "v"
	for _, name := range names {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeHTTPS, dns.TypeCAA, dns.TypeNULL} {
			for _, tcp := range []bool{false, true} {
				for _, ip := range []string{"192.0.2.1", "2001:db8::1", "::ffff:192.0.2.1"} {
					for _, do := range []bool{false, true} {
						for _, rcode := range []int{dns.RcodeSuccess, dns.RcodeNameError, dns.RcodeServerFailure, dns.RcodeRefused, 11} {
							server := serverLabel("labels")
							z := &metricsZones{server: server, view: view, names: zoneNames, plugin: "compactcache"}
							for _, n := range zoneNames {
								w := make([]byte, 255)
								l, _ := dns.PackDomainName(dns.Fqdn(n), w, 0, nil, false)
								z.wire = append(z.wire, w[:l])
							}
							wire := make([]byte, 255)
							l, err := dns.PackDomainName(name, wire, 0, nil, false)
							if err != nil {
								t.Fatal(err)
							}
							got := z.labelsOf(wire[:l], qtype, netip.MustParseAddr(ip), tcp, do, rcode)

							req := new(dns.Msg).SetQuestion(name, qtype)
							req.SetEdns0(1232, do)
							state := request.Request{W: &test.ResponseWriter{TCP: tcp, RemoteIP: ip}, Req: req}
							// The prometheus plugin's zone, from its ServeDNS.
							zone := plugin.Zones(zoneNames).Matches(state.QName())
							if zone == "" {
								zone = "."
							}
							vars.Report(server, state, zone, view, rcodeString(rcode), z.plugin, 100, time.Now())

							what := fmt.Sprintf("%s/%s tcp=%v %s do=%v rcode %d", name, dns.Type(qtype), tcp, ip, do, rcode)
							if n := testutil.ToFloat64(vars.RequestCount.WithLabelValues(server, got.zone, view, got.proto, got.family, got.qtype)); n != 1 {
								t.Fatalf("%s: requests_total{zone=%q proto=%q family=%q type=%q} is %v after Report, want 1", what, got.zone, got.proto, got.family, got.qtype, n)
							}
							if n := testutil.ToFloat64(vars.ResponseRcode.WithLabelValues(server, got.zone, view, got.rcode, z.plugin)); n != 1 {
								t.Fatalf("%s: responses_total{rcode=%q} is %v after Report, want 1", what, got.rcode, n)
							}
							if n := testutil.ToFloat64(vars.RequestDo.WithLabelValues(server, got.zone, view)); (n == 1) != do || got.do != do {
								t.Fatalf("%s: do_requests_total is %v after Report; labelsOf says DO %v", what, n, got.do)
							}
						}
					}
				}
			}
		}
	}
}

// TestRequestMetricsAllocatesNothing counts a hit in its series once they
// are known: no registry work, no allocation.
func TestRequestMetricsAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	server := serverLabel("alloc")
	z := &metricsZones{server: server, names: []string{"."}, wire: [][]byte{{0}}}
	m := z.reader()
	reply := packedReply(t, "www.example.org.", dns.TypeA, dns.RcodeSuccess)
	client := netip.MustParseAddr("192.0.2.1")
	hit := &Hit{DO: true, UDPSize: 1232}
	took := 100 * time.Microsecond
	m.count(reply, 40, client, false, hit, took)
	if allocs := testing.AllocsPerRun(1000, func() { m.count(reply, 40, client, false, hit, took) }); allocs != 0 {
		t.Errorf("%v allocations per counted hit, want 0", allocs)
	}
	if n := testutil.ToFloat64(vars.RequestCount.WithLabelValues(server, ".", "", "udp", "1", "A")); n != 1002 {
		t.Errorf("requests_total %v after 1002 hits (AllocsPerRun runs once more than asked)", n)
	}
}

// TestRequestMetricsKeys counts hits whose label sets alternate, so that
// each is found by its key after others came between, and checks every
// series: a key shared by two label sets, or a last series reused for
// another, would count a hit in the wrong one. The types labelled "other"
// share a key: a client asking every type makes no more keys than there are
// labels.
func TestRequestMetricsKeys(t *testing.T) {
	keys := map[seriesKey]bool{}
	for qtype := range 1 << 16 {
		keys[keyOf(0, uint16(qtype), dns.RcodeSuccess, false, false, false)] = true
	}
	if len(keys) != len(monitoredTypes)+1 {
		t.Errorf("%d keys for the 65536 types, want %d: one per type label", len(keys), len(monitoredTypes)+1)
	}
	server := serverLabel("keys")
	z := &metricsZones{server: server, names: []string{".", "example.org."}, wire: [][]byte{{0}, []byte("\x07example\x03org\x00")}}
	m := z.reader()
	type hit struct {
		name   string
		qtype  uint16
		rcode  int
		client string
		tcp    bool
		do     bool
	}
	hits := []hit{
		{"a.example.org.", dns.TypeA, dns.RcodeSuccess, "192.0.2.1", false, false},
		{"a.example.net.", dns.TypeA, dns.RcodeSuccess, "192.0.2.1", false, false},
		{"a.example.org.", dns.TypeAAAA, dns.RcodeSuccess, "2001:db8::1", true, true},
		{"a.example.org.", dns.TypeA, dns.RcodeNameError, "192.0.2.1", false, false},
		{"a.example.org.", dns.TypeA, dns.RcodeSuccess, "::ffff:192.0.2.1", false, false},
		{"a.example.org.", dns.TypeCAA, dns.RcodeSuccess, "192.0.2.1", false, false},
		{"a.example.org.", 65280, dns.RcodeSuccess, "192.0.2.1", false, false},
	}
	for _, h := range hits {
		m.count(packedReply(t, h.name, h.qtype, h.rcode), 40, netip.MustParseAddr(h.client), h.tcp, &Hit{DO: h.do}, time.Millisecond)
	}
	for _, c := range []struct {
		labels []string // zone, proto, family, type
		want   float64
	}{
		{[]string{"example.org.", "udp", "1", "A"}, 3},
		{[]string{".", "udp", "1", "A"}, 1},
		{[]string{"example.org.", "tcp", "2", "AAAA"}, 1},
		{[]string{"example.org.", "udp", "1", "other"}, 2},
	} {
		l := append([]string{server, c.labels[0], ""}, c.labels[1:]...)
		if n := testutil.ToFloat64(vars.RequestCount.WithLabelValues(l...)); n != c.want {
			t.Errorf("requests_total%v = %v, want %v", c.labels, n, c.want)
		}
	}
	for rcode, want := range map[string]float64{"NOERROR": 5, "NXDOMAIN": 1} {
		if n := testutil.ToFloat64(vars.ResponseRcode.WithLabelValues(server, "example.org.", "", rcode, "")); n != want {
			t.Errorf("responses_total{rcode=%s} = %v, want %v", rcode, n, want)
		}
	}
	if n := testutil.ToFloat64(vars.RequestDo.WithLabelValues(server, "example.org.", "")); n != 1 {
		t.Errorf("do_requests_total = %v, want 1", n)
	}
}

// BenchmarkRequestMetricsCount is a hit's cost in the prometheus plugin's
// series, its series known.
func BenchmarkRequestMetricsCount(b *testing.B) {
	z := &metricsZones{server: "dns://bench:53", names: []string{".", "cluster.local.", "in-addr.arpa.", "ip6.arpa."},
		wire: [][]byte{{0}, []byte("\x07cluster\x05local\x00"), []byte("\x07in-addr\x04arpa\x00"), []byte("\x03ip6\x04arpa\x00")}}
	m := z.reader()
	reply := packedReply(b, "www.example.org.", dns.TypeA, dns.RcodeSuccess)
	client := netip.MustParseAddr("192.0.2.1")
	hit := &Hit{UDPSize: 1232}
	took := 100 * time.Microsecond
	b.ReportAllocs()
	for b.Loop() {
		m.count(reply, 40, client, false, hit, took)
	}
}

// packedReply returns the packed reply with rcode to a question for name
// and qtype.
func packedReply(tb testing.TB, name string, qtype uint16, rcode int) []byte {
	tb.Helper()
	b, err := new(dns.Msg).SetRcode(new(dns.Msg).SetQuestion(name, qtype), rcode).Pack()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
