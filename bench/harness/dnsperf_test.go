//go:build linux

package harness

import (
	"math"
	"strings"
	"testing"
)

const dnsperfOutput = `DNS Performance Testing Tool
Version 2.10.0

[Status] Command line: dnsperf -s 127.0.0.1 -p 5399 -d q.txt -e -Q 1000 -l 2 -v
[Status] Sending queries (to 127.0.0.1:5399)
> NOERROR a.example. A 0.000318
> NOERROR b.example. AAAA 0.000149
> T c.example. A
> SERVFAIL d.example. TXT 0.000100
[Status] Testing complete (time limit)

Statistics:

  Queries sent:         2000
  Queries completed:    1999 (99.95%)
  Queries lost:         1 (0.05%)

  Response codes:       NOERROR 1998 (99.95%), SERVFAIL 1 (0.05%)
  Average packet size:  request 38, response 96
  Run time (s):         2.001579
  Queries per second:   999.211123

  Average Latency (s):  0.000123 (min 0.000017, max 0.003563)
  Latency StdDev (s):   0.000161
`

func TestParseDNSPerf(t *testing.T) {
	var log strings.Builder
	p, err := parseDNSPerf(strings.NewReader(dnsperfOutput), &log, true)
	if err != nil {
		t.Fatal(err)
	}
	if p.Sent != 2000 || p.Completed != 1999 || p.Lost != 1 {
		t.Errorf("sent %d completed %d lost %d", p.Sent, p.Completed, p.Lost)
	}
	if math.Abs(p.QPS-999.211123) > 1e-6 || math.Abs(p.Seconds-2.001579) > 1e-6 || math.Abs(p.AvgLatUS-123) > 1e-6 {
		t.Errorf("qps %v seconds %v avg %v", p.QPS, p.Seconds, p.AvgLatUS)
	}
	if p.RespBytes != 96 || !strings.HasPrefix(p.Rcodes, "NOERROR 1998") {
		t.Errorf("response bytes %v rcodes %q", p.RespBytes, p.Rcodes)
	}
	l := p.Lat
	if l == nil || l.N != 3 || l.Timeouts != 1 {
		t.Fatalf("latency %+v", l)
	}
	if math.Abs(l.P50-149) > 1e-6 || math.Abs(l.Max-318) > 1e-6 {
		t.Errorf("p50 %v max %v", l.P50, l.Max)
	}
	if strings.Contains(log.String(), "> NOERROR") || !strings.Contains(log.String(), "Queries sent") {
		t.Errorf("log holds the per-query lines or lacks the statistics:\n%s", log.String())
	}
	if p, _ := parseDNSPerf(strings.NewReader(dnsperfOutput), nil, false); p.Lat != nil {
		t.Error("latencies without -v")
	}
}

func TestPercentile(t *testing.T) {
	s := make([]float64, 1000)
	for i := range s {
		s[i] = float64(i + 1)
	}
	for _, c := range []struct{ p, want float64 }{{50, 500}, {99, 990}, {99.9, 999}, {100, 1000}, {0, 1}} {
		if got := percentile(s, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	l := summarize([]float64{3, 1, 2}, 0)
	if l.P50 != 2 || l.Max != 3 || l.Mean != 2 {
		t.Errorf("%+v", l)
	}
}
