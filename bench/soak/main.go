//go:build linux

// Command soak runs the custom CoreDNS build (cmd/coredns) with compactcache
// under steady dnsperf load for a long stretch, with a working set several
// times its byte budget, and records how it holds up: every interval, the
// server's resident memory, the queries answered per second, the queries
// lost and the error rcodes, with the cache's own figures beside them. It
// writes them to a CSV and draws them into a PNG.
//
//	bash bench/soak/run.sh                       # 10 minutes, the figures in bench/soak
//	bash bench/soak/run.sh -duration 1m -out /tmp/soak
//	go run ./bench/soak -plot bench/soak/soak.csv   # redraw the PNG from a CSV
//
// Everything runs on 127.0.0.1. The upstream is a second CoreDNS process of
// the same build serving, with the file plugin, a zone of the first -names
// entries of the reference workload (internal/workload); the load asks for
// those names with Zipf(-skew) popularity, so the popular ones are hits and
// the long tail keeps the cache evicting. dnsperf runs one -interval at a
// time, fed from one endless query stream, so each interval has its own
// counts of sent, answered and lost queries and of rcodes.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/compactcache/compactcache/bench/proc"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/miekg/dns"
)

func main() {
	var (
		duration    = flag.Duration("duration", 10*time.Minute, "how long the load runs")
		interval    = flag.Duration("interval", 10*time.Second, "sampling interval: one dnsperf run, one CSV row (whole seconds)")
		capacity    = flag.String("capacity", "8MiB", "compactcache's byte budget")
		names       = flag.Int("names", 500_000, "names in the upstream's zone: entries 0..names-1 of the reference workload")
		skew        = flag.Float64("skew", 0.9, "Zipf exponent of the names' popularity")
		qps         = flag.Int("qps", 10_000, "dnsperf's rate limit in queries per second (0: as fast as it can)")
		clients     = flag.Int("clients", 8, "dnsperf -c: client sockets")
		outstanding = flag.Int("outstanding", 200, "dnsperf -q: queries in flight at most")
		port        = flag.Int("port", 25353, "the server's UDP port on 127.0.0.1; the upstream uses port+1, the server's metrics port+2")
		out         = flag.String("out", "bench/soak", "directory for soak.csv and soak.png")
		binary      = flag.String("binary", "", "a built cmd/coredns to run instead of building one")
		keep        = flag.Bool("keep", false, "keep the work directory (zone, Corefiles, server logs)")
		plotOnly    = flag.String("plot", "", "only draw the PNG of this CSV (written beside it)")
	)
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("soak: ")

	if *plotOnly != "" {
		samples, err := readCSV(*plotOnly)
		if err != nil {
			log.Fatal(err)
		}
		png := strings.TrimSuffix(*plotOnly, ".csv") + ".png"
		if err := renderPNG(png, plotTitle, samples[0].Config, samples); err != nil {
			log.Fatal(err)
		}
		log.Printf("wrote %s", png)
		return
	}
	if *interval < time.Second || *interval%time.Second != 0 || *duration < *interval {
		log.Fatalf("-interval %v: want whole seconds, no longer than -duration %v", *interval, *duration)
	}
	if _, err := exec.LookPath("dnsperf"); err != nil {
		log.Fatal("dnsperf not found: run bench/soak/run.sh, which installs it, or apt-get install dnsperf")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	work, err := os.MkdirTemp("", "soak-")
	if err != nil {
		log.Fatal(err)
	}
	if *keep {
		log.Printf("work directory: %s", work)
	} else {
		defer os.RemoveAll(work)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		log.Fatal(err)
	}

	bin := *binary
	if bin == "" {
		bin = filepath.Join(work, "coredns")
		log.Printf("building cmd/coredns")
		if err := proc.BuildCoreDNS(ctx, bin); err != nil {
			log.Fatal(err)
		}
	}
	if err := proc.PortsFree(*port, *port+3); err != nil {
		log.Fatalf("%v (choose another -port)", err)
	}

	zone := filepath.Join(work, "zone.db")
	log.Printf("writing the zone of %d names", *names)
	if err := writeZone(zone, *names); err != nil {
		log.Fatal(err)
	}
	serverAddr := fmt.Sprintf("127.0.0.1:%d", *port)
	upAddr := fmt.Sprintf("127.0.0.1:%d", *port+1)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", *port+2)
	upstream, err := startServer(work, "upstream", bin, fmt.Sprintf(`.:%d {
    bind 127.0.0.1
    minimal
    file %s .
}
`, *port+1, zone))
	if err != nil {
		log.Fatal(err)
	}
	defer upstream.Stop(10 * time.Second)
	probe := workload.Question(0)
	if _, err := proc.WaitDNS(ctx, upstream, upAddr, probe, 10*time.Minute, 200*time.Millisecond); err != nil {
		log.Fatal(err)
	}
	server, err := startServer(work, "server", bin, fmt.Sprintf(`.:%d {
    bind 127.0.0.1
    prometheus %s
    compactcache {
        capacity %s
    }
    forward . %s
}
`, *port, metricsAddr, *capacity, upAddr))
	if err != nil {
		log.Fatal(err)
	}
	defer server.Stop(10 * time.Second)
	// Ask for a name that is not in the workload's stream, so that the
	// cache starts empty of it.
	if _, err := proc.WaitDNS(ctx, server, serverAddr, dns.Question{Name: "soak.invalid.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, time.Minute, 200*time.Millisecond); err != nil {
		log.Fatal(err)
	}

	csvPath := filepath.Join(*out, "soak.csv")
	f, err := os.Create(csvPath)
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	w := csv.NewWriter(f)
	w.Write(csvHeader)

	cfg := config{capacity: *capacity, names: *names, skew: *skew, qps: *qps, duration: *duration, interval: *interval}
	gen := newStream(*names, *skew)
	var samples []sample
	prev, err := scrape(ctx, metricsAddr)
	if err != nil {
		log.Fatal(err)
	}
	prevCPU, _ := proc.CPUTime(server.Pid())
	record := func(s sample) {
		samples = append(samples, s)
		w.Write(s.row(cfg))
		w.Flush()
		if err := w.Error(); err != nil {
			log.Fatal(err)
		}
		log.Printf("%5.0fs  rss %6.1f MiB  heap %6.1f MiB  store %5.1f MiB  %7.0f q/s  lost %d  servfail %d  other %d  hits %.1f%%  cpu %3.0f%%",
			s.Elapsed, float64(s.RSS)/(1<<20), float64(s.HeapInuse)/(1<<20), float64(s.StoreBytes)/(1<<20), s.QPS,
			s.Lost, s.ServFail, s.Other, 100*ratio(s.Hits, s.Hits+s.Misses), s.CPU)
	}
	first := sample{Interval: interval.Seconds()}
	first.fill(server.Pid(), prev, prev)
	record(first)

	log.Printf("load: %v, %s every %v, dnsperf -Q %d -c %d -q %d; Zipf(%.2f) over %d names; budget %s",
		*duration, "a sample", *interval, *qps, *clients, *outstanding, *skew, *names, *capacity)
	start := time.Now()
	for elapsed := time.Duration(0); elapsed < *duration && ctx.Err() == nil; {
		if server.Exited() {
			log.Fatalf("the server exited: %v (see %s)", server.Err(), server.Log)
		}
		p, err := runDNSPerf(ctx, filepath.Join(work, "dnsperf.log"), gen, []string{
			"-s", "127.0.0.1", "-p", strconv.Itoa(*port), "-l", strconv.Itoa(int(interval.Seconds())),
			"-c", strconv.Itoa(*clients), "-q", strconv.Itoa(*outstanding), "-t", "2", "-e",
		}, *qps)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			log.Fatal(err)
		}
		elapsed = time.Since(start)
		cur, err := scrape(ctx, metricsAddr)
		if err != nil {
			log.Fatal(err)
		}
		cpu, _ := proc.CPUTime(server.Pid())
		s := sample{Elapsed: elapsed.Seconds(), Interval: p.Seconds, QPS: p.QPS, Sent: p.Sent, Completed: p.Completed, Lost: p.Lost}
		s.NoError, s.NXDomain, s.ServFail = p.rcodes["NOERROR"], p.rcodes["NXDOMAIN"], p.rcodes["SERVFAIL"]
		for rc, n := range p.rcodes {
			if rc != "NOERROR" && rc != "NXDOMAIN" && rc != "SERVFAIL" {
				s.Other += n
			}
		}
		s.fill(server.Pid(), prev, cur)
		if p.Seconds > 0 {
			s.CPU = 100 * (cpu - prevCPU).Seconds() / p.Seconds
		}
		prev, prevCPU = cur, cpu
		record(s)
	}
	w.Flush()
	png := filepath.Join(*out, "soak.png")
	if err := renderPNG(png, plotTitle, cfg.String(), samples); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote %s and %s", csvPath, png)
	fmt.Println(summary(samples))
}

type config struct {
	capacity           string
	names              int
	skew               float64
	qps                int
	duration, interval time.Duration
}

// sample is one row of the CSV: an interval's load and what the server held
// at its end.
type sample struct {
	Elapsed    float64 // seconds since the load began, at the end of the interval
	Interval   float64 // the interval's length in seconds (dnsperf's run time)
	RSS        int64   // the server's VmRSS
	HeapInuse  int64   // its Go heap in use (go_memstats_heap_inuse_bytes)
	StoreBytes int64   // compactcache's bytes
	Capacity   int64   // compactcache's budget
	Entries    int64
	QPS        float64 // queries answered per second (dnsperf)
	Sent       int64
	Completed  int64
	Lost       int64 // sent and not answered within dnsperf's timeout (2 s)
	NoError    int64
	NXDomain   int64
	ServFail   int64
	Other      int64   // answers with any other rcode
	Hits       int64   // cache hits in the interval
	Misses     int64   // cache misses in the interval
	Evictions  int64   // entries evicted in the interval
	CPU        float64 // the server's CPU use, percent of one core
	Config     string  // the run's settings, on every row
}

var csvHeader = []string{
	"elapsed_s", "interval_s", "rss_bytes", "go_heap_inuse_bytes", "store_bytes", "capacity_bytes", "entries",
	"qps", "sent", "completed", "lost", "noerror", "nxdomain", "servfail", "other_rcodes",
	"hits", "misses", "evictions", "cpu_percent", "config",
}

func (c config) String() string {
	return fmt.Sprintf("capacity %s, %d names, Zipf %.2f, dnsperf -Q %d, %v, a sample every %v",
		c.capacity, c.names, c.skew, c.qps, c.duration, c.interval)
}

func (s sample) row(cfg config) []string {
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	conf := cfg.String()
	return []string{
		f(s.Elapsed), f(s.Interval), i(s.RSS), i(s.HeapInuse), i(s.StoreBytes), i(s.Capacity), i(s.Entries),
		f(s.QPS), i(s.Sent), i(s.Completed), i(s.Lost), i(s.NoError), i(s.NXDomain), i(s.ServFail), i(s.Other),
		i(s.Hits), i(s.Misses), i(s.Evictions), f(s.CPU), conf,
	}
}

func readCSV(path string) ([]sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) < 2 || strings.Join(rows[0], ",") != strings.Join(csvHeader, ",") {
		return nil, fmt.Errorf("%s: not a soak CSV (header %q)", path, rows[0])
	}
	var out []sample
	for _, r := range rows[1:] {
		fl := func(k int) float64 { v, _ := strconv.ParseFloat(r[k], 64); return v }
		in := func(k int) int64 { v, _ := strconv.ParseInt(r[k], 10, 64); return v }
		out = append(out, sample{
			Elapsed: fl(0), Interval: fl(1), RSS: in(2), HeapInuse: in(3), StoreBytes: in(4), Capacity: in(5), Entries: in(6),
			QPS: fl(7), Sent: in(8), Completed: in(9), Lost: in(10), NoError: in(11), NXDomain: in(12), ServFail: in(13), Other: in(14),
			Hits: in(15), Misses: in(16), Evictions: in(17), CPU: fl(18), Config: r[19],
		})
	}
	return out, nil
}

const plotTitle = "compactcache soak: cmd/coredns under dnsperf load"

// fill sets the memory and cache figures of s: the process's RSS now, the
// gauges of cur and the counters' growth from prev to cur.
func (s *sample) fill(pid int, prev, cur metrics) {
	s.RSS, _ = proc.RSS(pid)
	s.HeapInuse = int64(cur["go_memstats_heap_inuse_bytes"])
	s.StoreBytes = int64(cur["coredns_compactcache_bytes"])
	s.Capacity = int64(cur["coredns_compactcache_capacity_bytes"])
	s.Entries = int64(cur["coredns_cache_entries"])
	s.Hits = int64(cur["coredns_cache_hits_total"] - prev["coredns_cache_hits_total"])
	s.Misses = int64(cur["coredns_cache_misses_total"] - prev["coredns_cache_misses_total"])
	s.Evictions = int64(cur["coredns_cache_evictions_total"] - prev["coredns_cache_evictions_total"])
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// summary describes the run after its first minute (the fill).
func summary(samples []sample) string {
	var (
		n                                   int
		qps, cpu                            float64
		sent, lost, errs, hits, misses, evs int64
		minRSS, maxRSS                      int64 = 1 << 62, 0
		maxStore, capacity                  int64
	)
	for _, s := range samples {
		if s.Elapsed < 60 {
			continue
		}
		n++
		qps += s.QPS
		cpu += s.CPU
		sent += s.Sent
		lost += s.Lost
		errs += s.ServFail + s.Other
		hits += s.Hits
		misses += s.Misses
		evs += s.Evictions
		minRSS, maxRSS = min(minRSS, s.RSS), max(maxRSS, s.RSS)
		maxStore, capacity = max(maxStore, s.StoreBytes), s.Capacity
	}
	if n == 0 {
		return "soak: shorter than a minute: no summary"
	}
	last := samples[len(samples)-1]
	return fmt.Sprintf("after the first minute (%d samples): %.0f answered q/s on average, server CPU %.0f%% of a core; "+
		"%d queries sent, %d lost, %d SERVFAIL or other error rcodes; hit ratio %.1f%%, %d evictions; "+
		"RSS %.1f to %.1f MiB (%.1f MiB at the end); store at most %.1f MiB of a %.1f MiB budget",
		n, qps/float64(n), cpu/float64(n), sent, lost, errs, 100*ratio(hits, hits+misses), evs,
		float64(minRSS)/(1<<20), float64(maxRSS)/(1<<20), float64(last.RSS)/(1<<20),
		float64(maxStore)/(1<<20), float64(capacity)/(1<<20))
}

// writeZone writes the root zone holding entries [0, n) of the reference
// workload, as bench/e2e/zonegen does.
func writeZone(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	io.WriteString(w, `$ORIGIN .
$TTL 3600
.	3600	IN	SOA	ns.soak.invalid. hostmaster.soak.invalid. 1 7200 3600 1209600 3600
.	3600	IN	NS	ns.soak.invalid.
ns.soak.invalid.	3600	IN	A	127.0.0.1
`)
	for i := range n {
		for _, rr := range workload.Reply(i, workload.Plain).Answer {
			fmt.Fprintln(w, rr.String())
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// stream is the endless query stream: names drawn with Zipf popularity, as
// dnsperf input lines.
type stream struct {
	z   *workload.Zipf
	buf []byte
}

func newStream(n int, skew float64) *stream {
	return &stream{z: workload.NewZipf(n, skew, 1)}
}

func (s *stream) next() []byte {
	i := s.z.Next()
	s.buf = workload.AppendName(s.buf[:0], i)
	s.buf = append(s.buf, ' ')
	s.buf = append(s.buf, dns.TypeToString[workload.Qtype(i)]...)
	return append(s.buf, '\n')
}

// perf is what one dnsperf run reports.
type perf struct {
	Sent, Completed, Lost int64
	QPS, Seconds          float64
	rcodes                map[string]int64
}

// runDNSPerf runs dnsperf with args, feeding it queries from gen until it
// exits, and parses its report; its output is appended to logPath.
func runDNSPerf(ctx context.Context, logPath string, gen *stream, args []string, qps int) (perf, error) {
	if qps > 0 {
		args = append(args, "-Q", strconv.Itoa(qps))
	}
	cmd := exec.CommandContext(ctx, "dnsperf", args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return perf{}, err
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return perf{}, err
	}
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		bw := bufio.NewWriterSize(stdin, 64<<10)
		for {
			if _, err := bw.Write(gen.next()); err != nil {
				return // dnsperf is done: the pipe is closed
			}
		}
	}()
	werr := cmd.Wait()
	<-fed
	if lf, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		fmt.Fprintf(lf, "# dnsperf %s\n%s\n", strings.Join(args, " "), out.String())
		lf.Close()
	}
	if werr != nil {
		return perf{}, fmt.Errorf("dnsperf: %v\n%s", werr, out.String())
	}
	p := parseDNSPerf(out.String())
	if p.Sent == 0 {
		return p, fmt.Errorf("dnsperf sent nothing:\n%s", out.String())
	}
	return p, nil
}

func parseDNSPerf(out string) perf {
	p := perf{rcodes: map[string]int64{}}
	for _, line := range strings.Split(out, "\n") {
		key, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		first := val
		if f := strings.Fields(val); len(f) > 0 {
			first = f[0]
		}
		switch key {
		case "Queries sent":
			p.Sent, _ = strconv.ParseInt(first, 10, 64)
		case "Queries completed":
			p.Completed, _ = strconv.ParseInt(first, 10, 64)
		case "Queries lost":
			p.Lost, _ = strconv.ParseInt(first, 10, 64)
		case "Queries per second":
			p.QPS, _ = strconv.ParseFloat(first, 64)
		case "Run time (s)":
			p.Seconds, _ = strconv.ParseFloat(first, 64)
		case "Response codes":
			// "NOERROR 6000 (99.95%), SERVFAIL 3 (0.05%)"
			for _, part := range strings.Split(val, ",") {
				if f := strings.Fields(part); len(f) >= 2 {
					n, _ := strconv.ParseInt(f[1], 10, 64)
					p.rcodes[f[0]] += n
				}
			}
		}
	}
	return p
}

// metrics are the values of a Prometheus scrape, summed over label sets.
type metrics map[string]float64

func scrape(ctx context.Context, addr string) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %v", addr, err)
	}
	defer res.Body.Close()
	m := metrics{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if j := strings.LastIndexByte(rest, ' '); j >= 0 {
			if v, err := strconv.ParseFloat(rest[j+1:], 64); err == nil {
				m[name] += v
			}
		}
	}
	return m, sc.Err()
}

// startServer starts the build on corefile, written to dir with its log.
func startServer(dir, name, bin, corefile string) (*proc.Proc, error) {
	conf := filepath.Join(dir, name+".Corefile")
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "-conf", conf)
	cmd.Dir = dir
	return proc.Start(name, filepath.Join(dir, name+".log"), cmd)
}
