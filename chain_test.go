package compactcache

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// The rest of the chain must see what it sees with the stock cache. The
// plugins before the cache wrap the ResponseWriter and understand only
// WriteMsg, and nested lookups use writers without a Write of their own. Each
// test below runs a real server with such a plugin in front of compactcache,
// makes the cache answer from an entry (the upstream's count stays 1), and
// asserts something that only holds when the cache handed the plugin a
// *dns.Msg.

// logRcodes returns the rcodes the log plugin logged for queries of qtype
// for qname, in order. The default format is
// `{remote}:{port} - {>id} "{type} {class} {name} {proto} {size} {>do} {>bufsize}" {rcode} ...`.
func logRcodes(logs, qtype, qname string) []string {
	re := regexp.MustCompile(`"` + qtype + ` IN ` + regexp.QuoteMeta(qname) + ` [^"]*" (\S+) `)
	var out []string
	for _, m := range re.FindAllStringSubmatch(logs, -1) {
		out = append(out, m[1])
	}
	return out
}

// scrapeResponses returns coredns_dns_responses_total for zone and rcode
// from the prometheus plugin's HTTP endpoint, summed over the other labels.
func scrapeResponses(t *testing.T, zone, rcode string) float64 {
	t.Helper()
	code, body := testenv.Get(t, "http://"+metrics.ListenAddr+"/metrics")
	if code != 200 {
		t.Fatalf("scraping metrics: status %d", code)
	}
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "coredns_dns_responses_total{") ||
			!strings.Contains(line, `zone="`+zone+`"`) || !strings.Contains(line, `rcode="`+rcode+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return sum
}

// awaitResponses scrapes until the count of responses reaches want, for at
// most two seconds, and returns the last count.
func awaitResponses(t *testing.T, zone, rcode string, want float64) float64 {
	t.Helper()
	n := scrapeResponses(t, zone, rcode)
	for deadline := time.Now().Add(2 * time.Second); n < want && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n = scrapeResponses(t, zone, rcode)
	}
	return n
}

// TestChainLogAndPrometheusSeeCachedNXDOMAIN: the recorder behind log and
// prometheus takes the rcode from WriteMsg; on Write it keeps 0, so a cached
// NXDOMAIN written as bytes would be logged and counted as NOERROR.
func TestChainLogAndPrometheusSeeCachedNXDOMAIN(t *testing.T) {
	// Not parallel: captureLog takes the process's standard logger.
	logs := testenv.CaptureLog(t)
	u := newUpstream()
	soa := []dns.RR{test.SOA("nx.test. 300 IN SOA ns.nx.test. admin.nx.test. 1 7200 3600 1209600 60")}
	u.add("missing.nx.test.", dns.TypeA, dns.RcodeNameError, nil, soa, nil)
	// A zone of its own, so that the metrics of other tests' servers (all
	// labelled server="dns://127.0.0.1:0") do not count here.
	udp, _ := startCoreDNS(t, `nx.test.:0 {
	bind 127.0.0.1
	log
	prometheus 127.0.0.1:0
	compactcache
	forward . `+startUpstream(t, u)+`
}`)
	req := test.Case{Qname: "missing.nx.test.", Qtype: dns.TypeA}.Msg()
	if r, _ := exchangeUDP(t, udp, req); r.Rcode != dns.RcodeNameError {
		t.Fatalf("first query: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	// prometheus counts a response after it is written: wait for the count.
	before := awaitResponses(t, "nx.test.", "NXDOMAIN", 1)
	if r, _ := exchangeUDP(t, udp, req); r.Rcode != dns.RcodeNameError {
		t.Fatalf("second query: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	if n := u.count("missing.nx.test.", dns.TypeA); n != 1 {
		t.Fatalf("upstream asked %d times, want 1: the second query must be a hit", n)
	}
	if after := awaitResponses(t, "nx.test.", "NXDOMAIN", before+1); after != before+1 {
		t.Errorf("prometheus: %v NXDOMAIN responses after the cached query, want %v", after, before+1)
	}
	if noerr := scrapeResponses(t, "nx.test.", "NOERROR"); noerr != 0 {
		t.Errorf("prometheus: %v NOERROR responses, want 0", noerr)
	}
	// The log plugin logs after the reply is written; give it a moment.
	var rcodes []string
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if rcodes = logRcodes(logs.String(), "A", "missing.nx.test."); len(rcodes) >= 2 {
			break
		}
	}
	if len(rcodes) != 2 || rcodes[0] != "NXDOMAIN" || rcodes[1] != "NXDOMAIN" {
		t.Errorf("log: rcodes %q for the two queries, want NXDOMAIN twice; log:\n%s", rcodes, logs.String())
	}
}

// TestChainRewriteAnswerAuto: rewrite's ResponseReverter maps names back in
// WriteMsg; Write passes the bytes on, so the client would see the
// rewritten question and owners.
func TestChainRewriteAnswerAuto(t *testing.T) {
	t.Parallel()
	u := exampleUpstream()
	udp, tcp := startCoreDNS(t, `.:0 {
	bind 127.0.0.1
	rewrite name suffix .alias.test. .example.org. answer auto
	compactcache
	forward . `+startUpstream(t, u)+`
}`)
	for i, name := range []string{"a.alias.test.", "a.alias.test.", "A.Alias.Test."} {
		req := test.Case{Qname: name, Qtype: dns.TypeA}.Msg()
		var r *dns.Msg
		if i < 2 {
			r, _ = exchangeUDP(t, udp, req)
		} else {
			r = exchangeTCP(t, tcp, req)
		}
		if len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, name) {
			t.Errorf("query %d: question %v, want %s", i, r.Question, name)
		}
		if len(r.Answer) != 2 {
			t.Fatalf("query %d: answer %v, want two A records", i, r.Answer)
		}
		for _, rr := range r.Answer {
			if !strings.EqualFold(rr.Header().Name, name) {
				t.Errorf("query %d: owner %q, want %s reversed by rewrite", i, rr.Header().Name, name)
			}
		}
	}
	if n := u.count("a.example.org.", dns.TypeA); n != 1 {
		t.Errorf("upstream asked %d times, want 1", n)
	}
}

// TestChainLoadbalanceRotates: loadbalance shuffles in WriteMsg (on Write it
// warns and passes the bytes in the cached order), and the front end's
// reply writer shuffles its hits itself.
func TestChainLoadbalanceRotates(t *testing.T) {
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testChainLoadbalanceRotates(t, mode)
		})
	}
}

func testChainLoadbalanceRotates(t *testing.T, mode cacheMode) {
	u := newUpstream()
	var rrs []dns.RR
	for i := 1; i <= 4; i++ {
		rrs = append(rrs, test.A("lb.example.org. 300 IN A 192.0.2."+strconv.Itoa(i)))
	}
	u.add("lb.example.org.", dns.TypeA, dns.RcodeSuccess, rrs, nil, nil)
	up := startUpstream(t, u)
	corefile := func(options string) string {
		return `.:0 {
	bind 127.0.0.1
	loadbalance round_robin
	` + options + `
	forward . ` + up + `
}`
	}
	var udp string
	if mode.frontend {
		udp, _, _ = startFrontend(t, func(fe string) string { return corefile("compactcache {\n\t\tfrontend " + fe + "\n\t}") })
	} else {
		udp, _ = startCoreDNS(t, corefile("compactcache"))
	}
	req := test.Case{Qname: "lb.example.org.", Qtype: dns.TypeA}.Msg()
	exchangeUDP(t, udp, req) // the miss
	// forward asks again when the upstream is slow to answer, as on a
	// loaded machine: what the hits add is what is checked.
	asked := u.count("lb.example.org.", dns.TypeA)
	orders := map[string]bool{}
	for range 20 {
		r, _ := exchangeUDP(t, udp, req)
		if len(r.Answer) != 4 {
			t.Fatalf("answer %v, want four A records", r.Answer)
		}
		var ips []string
		for _, rr := range r.Answer {
			ips = append(ips, rr.(*dns.A).A.String())
		}
		orders[strings.Join(ips, " ")] = true
	}
	// 20 random shuffles of 4 records all alike: (1/24)^19.
	if len(orders) < 2 {
		t.Errorf("20 cached replies all in one order %v: loadbalance did not shuffle", orders)
	}
	if n := u.count("lb.example.org.", dns.TypeA); asked < 1 || n != asked {
		t.Errorf("upstream asked %d times for the miss and %d for the 20 hits, want at least 1 and 0", asked, n-asked)
	}
}

// TestChainTsigSignsCachedReplies: tsig adds its TSIG record in WriteMsg. A
// reply written as bytes goes out unsigned, which the client accepts
// silently, so the test asks for the TSIG record itself and verifies it.
func TestChainTsigSignsCachedReplies(t *testing.T) {
	t.Parallel()
	const key, secret = "key.test.", "NoTCJU+DMqFWywaPyxSijrDEA/eC3nK0xi3AMEZuPVk="
	u := exampleUpstream()
	udp, tcp := startCoreDNS(t, `.:0 {
	bind 127.0.0.1
	tsig {
		secret `+key+` `+secret+`
		require all
	}
	compactcache
	forward . `+startUpstream(t, u)+`
}`)
	for i := range 3 {
		req := test.Case{Qname: "a.example.org.", Qtype: dns.TypeA}.Msg()
		if i == 2 {
			req.SetEdns0(1232, false) // the OPT must stay before TSIG
		}
		req.SetTsig(key, dns.HmacSHA256, 300, time.Now().Unix())
		proto, addr := "udp", udp
		if i == 2 {
			proto, addr = "tcp", tcp
		}
		c := &dns.Client{Net: proto, Timeout: 5 * time.Second, TsigSecret: map[string]string{key: secret}}
		r, _, err := c.Exchange(req, addr)
		if err != nil {
			t.Fatalf("query %d over %s: %v", i, proto, err) // includes a TSIG that does not verify
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
			t.Fatalf("query %d: rcode %s, answer %v", i, dns.RcodeToString[r.Rcode], r.Answer)
		}
		ts := r.IsTsig()
		if ts == nil {
			t.Fatalf("query %d over %s: reply not signed", i, proto)
		}
		if ts.Error != dns.RcodeSuccess || ts.Hdr.Name != key {
			t.Errorf("query %d: TSIG %v", i, ts)
		}
		checkOPT(t, "query "+strconv.Itoa(i), r, req)
	}
	if n := u.count("a.example.org.", dns.TypeA); n != 1 {
		t.Errorf("upstream asked %d times, want 1", n)
	}
}

// TestChainAutopathThroughCache: autopath walks its search path with
// nonwriter.Writer, which has no Write of its own: a reply written as bytes
// would bypass it and reach the client for the wrong name. autopath takes
// its search path from a resolv.conf here; @kubernetes would need an API
// server and gives autopath nothing else.
func TestChainAutopathThroughCache(t *testing.T) {
	t.Parallel()
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search first.test. second.test.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	u := newUpstream()
	u.add("foo.first.test.", dns.TypeA, dns.RcodeNameError, nil,
		[]dns.RR{test.SOA("first.test. 300 IN SOA ns.first.test. admin.first.test. 1 7200 3600 1209600 60")}, nil)
	u.add("foo.second.test.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("foo.second.test. 300 IN A 192.0.2.77")}, nil, nil)
	udp, _ := startCoreDNS(t, `.:0 {
	bind 127.0.0.1
	autopath `+resolv+`
	compactcache
	forward . `+startUpstream(t, u)+`
}`)
	req := test.Case{Qname: "foo.first.test.", Qtype: dns.TypeA}.Msg()
	for i := range 2 {
		r, _ := exchangeUDP(t, udp, req)
		if r.Rcode != dns.RcodeSuccess || len(r.Question) != 1 || r.Question[0].Name != "foo.first.test." {
			t.Fatalf("query %d: rcode %s, question %v; want NOERROR for foo.first.test.", i, dns.RcodeToString[r.Rcode], r.Question)
		}
		var cname, a bool
		for _, rr := range r.Answer {
			switch rr := rr.(type) {
			case *dns.CNAME:
				cname = rr.Hdr.Name == "foo.first.test." && rr.Target == "foo.second.test."
			case *dns.A:
				a = rr.Hdr.Name == "foo.second.test." && rr.A.String() == "192.0.2.77"
			}
		}
		if !cname || !a {
			t.Errorf("query %d: answer %v, want foo.first.test. CNAME foo.second.test. and its A", i, r.Answer)
		}
	}
	for _, name := range []string{"foo.first.test.", "foo.second.test."} {
		if n := u.count(name, dns.TypeA); n != 1 {
			t.Errorf("%s: upstream asked %d times, want 1", name, n)
		}
	}
}

// nestedZone is a zone whose names are CNAMEs to a name outside it.
const nestedZone = `$ORIGIN example.org.
@	3600 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 3600
	3600 IN NS  ns.example.org.
ns	3600 IN A   192.0.2.53
alias1	3600 IN CNAME www.example.net.
alias2	3600 IN CNAME www.example.net.
alias3	3600 IN CNAME www.example.net.
`

// TestChainNestedLookupThroughCache stands in for the kubernetes plugin's
// ExternalName resolution, which needs an API server. Both resolve a name
// outside their zone through plugin/pkg/upstream: kubernetes.Lookup calls
// k.Upstream.Lookup (plugin/kubernetes/kubernetes.go) and file's
// externalLookup calls z.Upstream.Lookup (plugin/file/lookup.go), both set
// to upstream.New() at setup. upstream.Lookup sends the query through the
// server's ServeDNS again with a nonwriter.Writer, which keeps WriteMsg's
// message and has no Write of its own: a reply written as bytes would go to
// the client instead, for the wrong question, and the lookup would find
// nothing. Every alias CNAMEs to www.example.net., so from the second alias
// on the nested lookup is answered from the cache.
func TestChainNestedLookupThroughCache(t *testing.T) {
	t.Parallel()
	zone := filepath.Join(t.TempDir(), "db.example.org")
	if err := os.WriteFile(zone, []byte(nestedZone), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		corefile func(up string) string
	}{{
		// One block, as in a cluster's Corefile: the lookup comes back to
		// the block's first plugin. file stands after the cache, so hits to
		// clients go out as bytes; the nested lookup's must not.
		"one block",
		func(up string) string {
			return `.:0 {
	bind 127.0.0.1
	file ` + zone + ` example.org.
	compactcache
	forward . ` + up + `
}`
		},
	}, {
		// The cache's block holds raw-safe plugins only, so hits to
		// clients go out as bytes; the nested lookup from the other block
		// reaches compactcache directly, through the server's ScrubWriter.
		"raw-safe block",
		func(up string) string {
			return `example.org.:0 {
	bind 127.0.0.1
	file ` + zone + `
}
.:0 {
	bind 127.0.0.1
	compactcache
	forward . ` + up + `
}`
		},
	}, {
		// The same with another raw-safe plugin before compactcache: the
		// nested lookup then reaches compactcache through that plugin's
		// writer too.
		"raw-safe block with errors",
		func(up string) string {
			return `example.org.:0 {
	bind 127.0.0.1
	file ` + zone + `
}
.:0 {
	bind 127.0.0.1
	errors
	compactcache
	forward . ` + up + `
}`
		},
	}, {
		// The cluster DNS's Corefile (deploy/kubernetes/coredns.yaml):
		// prometheus and loadbalance before the cache wrap the nested
		// lookup's writer in theirs.
		"one block with prometheus and loadbalance",
		func(up string) string {
			return `.:0 {
	bind 127.0.0.1
	errors
	prometheus 127.0.0.1:0
	file ` + zone + ` example.org.
	compactcache
	forward . ` + up + `
	loadbalance
}`
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := newUpstream()
			u.add("www.example.net.", dns.TypeA, dns.RcodeSuccess, []dns.RR{test.A("www.example.net. 300 IN A 192.0.2.80")}, nil, nil)
			udp, tcp := startCoreDNS(t, tc.corefile(startUpstream(t, u)))
			for i, name := range []string{"alias1.example.org.", "alias2.example.org.", "alias3.example.org."} {
				req := test.Case{Qname: name, Qtype: dns.TypeA}.Msg()
				var r *dns.Msg
				if i < 2 {
					r, _ = exchangeUDP(t, udp, req)
				} else {
					r = exchangeTCP(t, tcp, req)
				}
				if err := nestedAnswer(r, name); err != "" {
					t.Errorf("%s: %s; reply:\n%v", name, err, r)
				}
			}
			if n := u.count("www.example.net.", dns.TypeA); n != 1 {
				t.Errorf("www.example.net.: upstream asked %d times, want 1", n)
			}
			// A direct query for the target is a hit; in the raw-safe
			// blocks it goes out as bytes, and must still be right.
			req := test.Case{Qname: "www.example.net.", Qtype: dns.TypeA}.Msg()
			if r, _ := exchangeUDP(t, udp, req); len(r.Answer) != 1 || r.Question[0].Name != "www.example.net." {
				t.Errorf("www.example.net. directly: %v", r)
			}
			if n := u.count("www.example.net.", dns.TypeA); n != 1 {
				t.Errorf("www.example.net.: upstream asked %d times, want 1", n)
			}
		})
	}
}

// nestedAnswer says what is wrong with r as the answer to name, an alias of
// www.example.net., or "".
func nestedAnswer(r *dns.Msg, name string) string {
	if r.Rcode != dns.RcodeSuccess {
		return "rcode " + dns.RcodeToString[r.Rcode]
	}
	if len(r.Question) != 1 || r.Question[0].Name != name {
		return "question for another name"
	}
	if len(r.Answer) != 2 {
		return "want the CNAME and the target's A"
	}
	c, ok := r.Answer[0].(*dns.CNAME)
	if !ok || c.Hdr.Name != name || c.Target != "www.example.net." {
		return "want the CNAME first"
	}
	a, ok := r.Answer[1].(*dns.A)
	if !ok || a.Hdr.Name != "www.example.net." || a.A.String() != "192.0.2.80" {
		return "want www.example.net.'s A, resolved through the cache"
	}
	return ""
}

// TestChainRawHitsInKubeDNSBlock: in a block of the kube-dns Corefile's
// plugins (errors, prometheus, loadbalance before the cache), hits go out as
// bytes in plugin mode: the metrics recorder counts each with its rcode, a
// cached NXDOMAIN as NXDOMAIN, the records are rotated as loadbalance would,
// and loadbalance's Write, which logs a warning for every call, is not used.
func TestChainRawHitsInKubeDNSBlock(t *testing.T) {
	logs := testenv.CaptureLog(t)
	const zone = "raw.kube.test."
	u := newUpstream()
	var rrs []dns.RR
	for i := 1; i <= 4; i++ {
		rrs = append(rrs, test.A("lb."+zone+" 300 IN A 192.0.2."+strconv.Itoa(i)))
	}
	u.add("lb."+zone, dns.TypeA, dns.RcodeSuccess, rrs, nil, nil)
	u.add("nx."+zone, dns.TypeA, dns.RcodeNameError, nil, []dns.RR{test.SOA(zone + " 300 IN SOA ns." + zone + " admin." + zone + " 1 7200 3600 1209600 60")}, nil)
	udp, _ := startCoreDNS(t, zone+`:0 {
	bind 127.0.0.1
	errors
	prometheus 127.0.0.1:0
	loadbalance
	compactcache
	forward . `+startUpstream(t, u)+`
}`)
	nx := test.Case{Qname: "nx." + zone, Qtype: dns.TypeA}.Msg()
	lb := test.Case{Qname: "lb." + zone, Qtype: dns.TypeA}.Msg()
	base := scrapeResponses(t, zone, "NXDOMAIN")
	exchangeUDP(t, udp, nx) // the misses
	exchangeUDP(t, udp, lb)
	// The miss is counted once its reply is written, maybe after the
	// client has it: counted before the hits are.
	before := awaitResponses(t, zone, "NXDOMAIN", base+1)
	orders := map[string]bool{}
	for range 20 {
		if r, _ := exchangeUDP(t, udp, nx); r.Rcode != dns.RcodeNameError {
			t.Fatalf("cached NXDOMAIN answered %s", dns.RcodeToString[r.Rcode])
		}
		r, _ := exchangeUDP(t, udp, lb)
		var ips []string
		for _, rr := range r.Answer {
			ips = append(ips, rr.(*dns.A).A.String())
		}
		orders[strings.Join(ips, " ")] = true
	}
	if got := awaitResponses(t, zone, "NXDOMAIN", before+20); got != before+20 {
		t.Errorf("prometheus: %v NXDOMAIN responses after 20 cached ones, want %v", got, before+20)
	}
	if len(orders) < 2 {
		t.Errorf("20 hits all in one order %v: not rotated", orders)
	}
	if strings.Contains(logs.String(), "LoadBalance called with Write") {
		t.Error("hits went through loadbalance's Write, which shuffles nothing and warns")
	}
	if n := u.count("nx."+zone, dns.TypeA) + u.count("lb."+zone, dns.TypeA); n != 2 {
		t.Errorf("upstream asked %d times, want 2", n)
	}
}

// TestChainTransferThroughCache: a zone transfer from transfer behind the
// cache reaches the client whole, in as many messages as transfer writes,
// with the zone's DNSSEC records, through CoreDNS's server and through the
// front end.
func TestChainTransferThroughCache(t *testing.T) {
	var zone strings.Builder
	zone.WriteString("example.org. 300 IN SOA ns.example.org. admin.example.org. 1 7200 3600 1209600 60\n")
	zone.WriteString("example.org. 300 IN NS ns.example.org.\n")
	zone.WriteString("ns.example.org. 300 IN A 192.0.2.53\n")
	zone.WriteString("ns.example.org. 300 IN RRSIG A 8 3 300 20300101000000 20200101000000 12345 example.org. AAAA\n")
	zone.WriteString("ns.example.org. 300 IN NSEC h0.example.org. A RRSIG NSEC\n")
	const hosts = 3000 // more than the 63,000 bytes transfer puts in one message
	for i := range hosts {
		fmt.Fprintf(&zone, "h%d.example.org. 300 IN A 192.0.2.%d\n", i, i%250+1)
	}
	file := filepath.Join(t.TempDir(), "db.example.org")
	if err := os.WriteFile(file, []byte(zone.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	const records = 5 + hosts + 1 // and the closing SOA
	for _, mode := range cacheModes {
		t.Run(mode.name, func(t *testing.T) {
			corefile := func(options string) string {
				return `example.org.:0 {
	bind 127.0.0.1
	` + options + `
	file ` + file + `
	transfer {
		to *
	}
}`
			}
			var addr string
			if mode.frontend {
				addr, _, _ = startFrontend(t, func(fe string) string { return corefile("compactcache {\n\t\tfrontend " + fe + "\n\t}") })
			} else {
				_, addr = startCoreDNS(t, corefile("compactcache"))
			}
			for i := range 2 {
				m := new(dns.Msg)
				m.SetAxfr("example.org.")
				envelopes, err := (&dns.Transfer{}).In(m, addr)
				if err != nil {
					t.Fatal(err)
				}
				var n, sigs, nsecs, messages int
				for env := range envelopes {
					if env.Error != nil {
						t.Fatalf("transfer %d: %v", i, env.Error)
					}
					messages++
					n += len(env.RR)
					for _, rr := range env.RR {
						switch rr.Header().Rrtype {
						case dns.TypeRRSIG:
							sigs++
						case dns.TypeNSEC:
							nsecs++
						}
					}
				}
				if n != records || sigs != 1 || nsecs != 1 || messages < 2 {
					t.Errorf("transfer %d: %d records (%d RRSIG, %d NSEC) in %d messages, want %d (1, 1) in at least 2", i, n, sigs, nsecs, messages, records)
				}
			}
		})
	}
}
