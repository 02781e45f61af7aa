package frontend

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metrics/vars"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLabelsAsReport gives requests of every kind the labels labelsOf
// computes and vars.Report, which the prometheus plugin calls in plugin
// mode, and checks that Report counted each in exactly the series labelsOf
// names: zones (longest match, none, case), protocols, families (IPv4,
// IPv6, IPv4-mapped), monitored and other types, DO, and every rcode.
func TestLabelsAsReport(t *testing.T) {
	zoneNames := []string{"example.org.", "sub.example.org.", "cluster.local."}
	names := []string{"a.example.org.", "X.Sub.Example.ORG.", "sub.example.org.", "svc.cluster.local.", "elsewhere.net.", "."}
	view := "v"
	i := 0
	for _, name := range names {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeHTTPS, dns.TypeCAA, dns.TypeNULL} {
			for _, tcp := range []bool{false, true} {
				for _, ip := range []string{"192.0.2.1", "2001:db8::1", "::ffff:192.0.2.1"} {
					for _, do := range []bool{false, true} {
						for _, rcode := range []int{dns.RcodeSuccess, dns.RcodeNameError, dns.RcodeServerFailure, dns.RcodeRefused, 11} {
							i++
							server := fmt.Sprintf("dns://labels-%d:53", i)
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
	z := &metricsZones{server: "dns://alloc:53", names: []string{"."}, wire: [][]byte{{0}}}
	m := z.reader()
	req := new(dns.Msg).SetQuestion("www.example.org.", dns.TypeA)
	reply, err := new(dns.Msg).SetReply(req).Pack()
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddr("192.0.2.1")
	hit := &Hit{DO: true, UDPSize: 1232}
	start := time.Now()
	m.count(reply, 40, client, false, hit, start)
	if allocs := testing.AllocsPerRun(1000, func() { m.count(reply, 40, client, false, hit, start) }); allocs != 0 {
		t.Errorf("%v allocations per counted hit, want 0", allocs)
	}
	if n := testutil.ToFloat64(vars.RequestCount.WithLabelValues("dns://alloc:53", ".", "", "udp", "1", "A")); n != 1002 {
		t.Errorf("requests_total %v after 1002 hits (AllocsPerRun runs once more than asked)", n)
	}
}
