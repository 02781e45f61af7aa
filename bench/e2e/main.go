//go:build linux

// Command e2e measures the custom CoreDNS build (cmd/coredns) end to end over
// UDP on the loopback, with dnsperf, for compactcache and the stock cache in
// the same run: RSS per cached entry, hit queries/s, p50/p99 latency at fixed
// rates, and the server's CPU time per query beside the same build serving
// whoami alone, and beside Unbound as a caching forwarder. It also takes
// CPU profiles under hit load. bench/e2e/run.sh
// installs dnsperf and runs it; bench/e2e/RESULTS.md describes the method and
// holds a run's tables.
//
// Every address is 127.0.0.1; the run is bounded by -timeout and each phase
// by -duration.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/compactcache/compactcache/bench/harness"
	"github.com/compactcache/compactcache/internal/workload"
	"github.com/miekg/dns"
)

const defaultConfigs = "whoami kube-whoami compact frontend stock unbound kube-compact kube-stock " +
	"compact@GOGC=400 compact@GOGC=off,GOMEMLIMIT=256MiB"

type options struct {
	n           int
	out         string
	duration    time.Duration
	rates       []int
	configs     []config
	profiles    []config
	profileTime time.Duration
	basePort    int
	serverCore  int
	clientCore  int
	capacity    string
	timeout     time.Duration
	clients     int
	outstanding int
	verify      int
	rounds      int
	rev         string
	quietWait   time.Duration
	rtRates     bool
	rtMax       bool
}

// config is one server under test: a kind of Corefile, the environment of
// the server process, and the commit its CoreDNS is built from, written
// "kind" or "kind@VAR=value,...,rev=REV". A rev puts a commit's build beside
// the work tree's in one run: the figures of a change before and after it.
type config struct {
	Spec string
	Kind string
	Env  []string
	Rev  string `json:",omitempty"`
}

func parseConfig(s string) (config, error) {
	kind, env, _ := strings.Cut(s, "@")
	c := config{Spec: s, Kind: kind}
	ok := false
	for _, k := range kinds {
		ok = ok || k == kind
	}
	if !ok {
		return c, fmt.Errorf("config %q: kind %q is not one of %s", s, kind, strings.Join(kinds, ", "))
	}
	if env != "" {
		for _, kv := range strings.Split(env, ",") {
			k, v, ok := strings.Cut(kv, "=")
			switch {
			case !ok || k == "":
				return c, fmt.Errorf("config %q: %q is not VAR=value", s, kv)
			case k == "rev" && v == "":
				return c, fmt.Errorf("config %q: rev= names no commit", s)
			case k == "rev":
				c.Rev = v
			default:
				c.Env = append(c.Env, kv)
			}
		}
	}
	return c, nil
}

func parseConfigs(s string) ([]config, error) {
	var cs []config
	for _, f := range strings.Fields(s) {
		c, err := parseConfig(f)
		if err != nil {
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

func main() {
	log.SetFlags(log.Ltime)
	log.SetPrefix("e2e: ")
	var o options
	var rates, configs, profiles, from, plotPath string
	flag.IntVar(&o.n, "n", 200_000, "entries of the reference workload to serve and cache")
	flag.StringVar(&o.out, "out", "", "directory for binaries, zone, Corefiles, logs, profiles and results (default: a new one under /tmp)")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "length of each measured phase")
	flag.StringVar(&rates, "rates", "30000,10000,2000", "fixed query rates (queries/s) at which to take latency percentiles")
	flag.StringVar(&configs, "configs", defaultConfigs, "servers to measure, space-separated: KIND or KIND@VAR=value,... (rev=REV: CoreDNS built from that commit) with KIND one of "+strings.Join(kinds, ", "))
	flag.StringVar(&profiles, "profiles", "compact frontend kube-compact stock whoami", "servers to CPU-profile under hit load, in runs of their own (\"\" for none)")
	flag.DurationVar(&o.profileTime, "profile-time", 12*time.Second, "length of each CPU profile")
	flag.IntVar(&o.basePort, "port", 15300, "first of 8 loopback ports the run uses")
	flag.IntVar(&o.serverCore, "server-core", 0, "CPU the server under test is pinned to")
	flag.IntVar(&o.clientCore, "client-core", 1, "CPU dnsperf, the upstream and this program are pinned to")
	flag.StringVar(&o.capacity, "capacity", "256MiB", "compactcache's capacity")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Minute, "bound on the whole run")
	flag.IntVar(&o.clients, "clients", 20, "dnsperf -c: client sockets")
	flag.IntVar(&o.outstanding, "outstanding", 200, "dnsperf -q for the max-throughput phase")
	flag.IntVar(&o.verify, "verify", 2000, "entries whose cached replies are checked against the workload after the fill")
	flag.StringVar(&o.rev, "rev", "", "build cmd/coredns from this git revision (exported into the output directory) instead of the work tree as it is")
	flag.DurationVar(&o.quietWait, "quiet-wait", 30*time.Second, "before each measured phase, wait up to this long for the two cores to be free of other work (0: do not wait)")
	flag.IntVar(&niceness, "nice", 0, "niceness of the servers and dnsperf (nice -n); on a shared machine -10 gives them precedence over other work on their cores")
	flag.BoolVar(&o.rtRates, "rt-rates", false, "run the server and dnsperf under SCHED_RR during the fixed-rate phases, so that other work on a shared machine does not set their latency (needs root)")
	flag.BoolVar(&o.rtMax, "rt-max", false, "run the server and dnsperf under SCHED_RR during the max-throughput phase too, so that other work on a shared machine does not take the server's core while it has work (needs root; the kernel's RT throttling leaves other tasks 5% of each core)")
	flag.IntVar(&o.rounds, "rounds", 1, "times to measure each config, round-robin; the tables show the median of the rounds")
	flag.StringVar(&from, "from", "", "print the tables of an earlier run's results.json and exit")
	flag.StringVar(&plotPath, "plot", "", "with -from: draw CPU per query against the offered rate into this PNG file (a run draws DIR/cpu-per-query.png)")
	flag.Parse()

	if from != "" {
		b, err := os.ReadFile(from)
		if err != nil {
			log.Fatal(err)
		}
		var rep report
		if err := json.Unmarshal(b, &rep); err != nil {
			log.Fatalf("%s: %v", from, err)
		}
		if err := rep.write(os.Stdout); err != nil {
			log.Fatal(err)
		}
		if plotPath != "" {
			if err := rep.writePlot(plotPath); err != nil {
				log.Fatal(err)
			}
		}
		return
	}

	var err error
	if o.configs, err = parseConfigs(configs); err != nil {
		log.Fatal(err)
	}
	if o.profiles, err = parseConfigs(profiles); err != nil {
		log.Fatal(err)
	}
	for _, f := range strings.Split(rates, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		r, err := strconv.Atoi(f)
		if err != nil || r <= 0 {
			log.Fatalf("-rates: %q is not a positive number", f)
		}
		o.rates = append(o.rates, r)
	}
	if o.n < 1 {
		log.Fatal("-n: want at least 1")
	}
	if o.rounds < 1 {
		log.Fatal("-rounds: want at least 1")
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, o.timeout)
	defer cancelTimeout()

	rep, err := run(ctx, o)
	if rep != nil {
		if werr := rep.write(os.Stdout); werr != nil {
			log.Print(werr)
		}
	}
	if err != nil {
		log.Fatal(err)
	}
}

type runner struct {
	o        options
	dir      string
	bin      string            // the custom CoreDNS build
	revBins  map[string]string // builds of the configs' revs, by rev
	unbound  string            // the unbound binary, for the unbound kind
	zone     string
	warm     string
	fill     string
	hit      string
	p        ports
	cs       cacheSpec
	upstream *harness.Proc
	gcOff    int64
}

func run(ctx context.Context, o options) (*report, error) {
	for _, tool := range []string{"go", "taskset", "dnsperf"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found: run bench/e2e/run.sh, which installs what the run needs", tool)
		}
	}
	unbound := ""
	if slices.ContainsFunc(o.configs, isUnbound) {
		p, err := unboundPath()
		if err != nil {
			return nil, err
		}
		unbound = p
	}
	root, err := harness.ModuleRoot()
	if err != nil {
		return nil, err
	}
	dir := o.out
	if dir == "" {
		if dir, err = os.MkdirTemp("", "compactcache-e2e-"); err != nil {
			return nil, err
		}
	} else if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	log.Printf("output in %s", dir)

	mach := harness.Machine()

	// This program and its children other than the server stay off the
	// server's core.
	if out, err := exec.Command("taskset", "-a", "-p", "-c", strconv.Itoa(o.clientCore), strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("taskset: %v: %s", err, out)
	}

	r := &runner{
		o: o, dir: dir,
		bin:     filepath.Join(dir, "coredns"),
		unbound: unbound,
		zone:    filepath.Join(dir, "data", "zone.db"),
		warm:    filepath.Join(dir, "data", "warm.txt"),
		fill:    filepath.Join(dir, "data", "fill.txt"),
		hit:     filepath.Join(dir, "data", "hit.txt"),
		p:       newPorts(o.basePort),
		cs:      cacheSpec{capacity: o.capacity, success: max(300_000, o.n*3/2)},
	}
	if err := harness.PortsFree(r.p.server, r.p.reserveEnd); err != nil {
		return nil, fmt.Errorf("%v (choose another -port)", err)
	}

	src, source, err := harness.SourceTree(ctx, root, o.rev, dir)
	if err != nil {
		return nil, err
	}
	log.Printf("building cmd/coredns from %s", source)
	if err := harness.BuildCoreDNS(ctx, src, r.bin); err != nil {
		return nil, err
	}
	log.Printf("writing the zone and query files of %d entries", o.n)
	if err := writeData(filepath.Join(dir, "data"), o.n, 1); err != nil {
		return nil, err
	}

	mach["source"] = source
	if err := r.buildRevs(ctx, root, mach); err != nil {
		return nil, err
	}
	if out, err := exec.Command(r.bin, "-version").Output(); err == nil {
		mach["coredns"] = strings.Join(strings.Fields(string(out)), " ")
	}
	if unbound != "" {
		if out, err := exec.Command(unbound, "-V").Output(); err == nil {
			mach["unbound"], _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
		}
	}
	if err := os.WriteFile(r.warm, []byte(probeName+" A\n"), 0o644); err != nil {
		return nil, err
	}
	rep := &report{Options: o.describe(), Machine: mach, Started: time.Now().UTC().Format(time.RFC3339)}
	if err := r.startUpstream(ctx); err != nil {
		return rep, err
	}
	defer r.upstream.Stop(5 * time.Second)

	for round := 1; round <= o.rounds; round++ {
		for _, c := range o.configs {
			if ctx.Err() != nil {
				break
			}
			log.Printf("== %s (round %d of %d)", c.Spec, round, o.rounds)
			res := r.measure(ctx, c)
			res.Round = round
			if res.Err != "" {
				log.Printf("%s: %s", c.Spec, res.Err)
			}
			rep.Results = append(rep.Results, res)
			rep.save(dir)
		}
	}
	for _, c := range o.profiles {
		if ctx.Err() != nil {
			break
		}
		log.Printf("== profile %s", c.Spec)
		pr := r.profile(ctx, c)
		if pr.Err != "" {
			log.Printf("profile %s: %s", c.Spec, pr.Err)
		}
		rep.Profiles = append(rep.Profiles, pr)
		rep.save(dir)
	}
	rep.Finished = time.Now().UTC().Format(time.RFC3339)
	rep.save(dir)
	return rep, ctx.Err()
}

func (o options) describe() map[string]string {
	var cs, ps []string
	for _, c := range o.configs {
		cs = append(cs, c.Spec)
	}
	for _, c := range o.profiles {
		ps = append(ps, c.Spec)
	}
	var rs []string
	for _, r := range o.rates {
		rs = append(rs, strconv.Itoa(r))
	}
	return map[string]string{
		"command":     commandLine(),
		"n":           strconv.Itoa(o.n),
		"duration":    o.duration.String(),
		"rates":       strings.Join(rs, ","),
		"configs":     strings.Join(cs, " "),
		"profiles":    strings.Join(ps, " "),
		"capacity":    o.capacity,
		"server-core": strconv.Itoa(o.serverCore),
		"client-core": strconv.Itoa(o.clientCore),
		"clients":     strconv.Itoa(o.clients),
		"outstanding": strconv.Itoa(o.outstanding),
		"rounds":      strconv.Itoa(o.rounds),
		"quiet-wait":  o.quietWait.String(),
		"nice":        strconv.Itoa(niceness),
		"rt-rates":    strconv.FormatBool(o.rtRates),
		"rt-max":      strconv.FormatBool(o.rtMax),
	}
}

// buildRevs builds cmd/coredns of each commit the configs name, beside the
// work tree's build, and says in mach what each was built from.
func (r *runner) buildRevs(ctx context.Context, root string, mach map[string]string) error {
	r.revBins = map[string]string{}
	for _, c := range r.o.configs {
		if c.Rev == "" || r.revBins[c.Rev] != "" {
			continue
		}
		dir := filepath.Join(r.dir, "rev-"+c.Rev)
		src, source, err := harness.SourceTree(ctx, root, c.Rev, dir)
		if err != nil {
			return err
		}
		bin := filepath.Join(dir, "coredns")
		log.Printf("building cmd/coredns of rev=%s from %s", c.Rev, source)
		if err := harness.BuildCoreDNS(ctx, src, bin); err != nil {
			return err
		}
		r.revBins[c.Rev] = bin
		mach[revSource(c.Rev)] = source
	}
	return nil
}

// revSource is the key of the machine description that says what the
// build of rev was made from.
func revSource(rev string) string { return "source of rev=" + rev }

// binOf returns the CoreDNS build that serves c.
func (r *runner) binOf(c config) string {
	if c.Rev != "" {
		return r.revBins[c.Rev]
	}
	return r.bin
}

// commandLine is how this run was started, as bench/e2e/run.sh would.
func commandLine() string {
	args := []string{"bash bench/e2e/run.sh"}
	for _, a := range os.Args[1:] {
		if a == "" || strings.ContainsAny(a, " '\"$") {
			a = "'" + a + "'"
		}
		args = append(args, a)
	}
	return strings.Join(args, " ")
}

// serverEnv is this process's environment without the Go runtime's knobs,
// plus gctrace (one line per GC cycle on stderr, counted per phase) and the
// config's variables.
func serverEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "GOGC", "GOMEMLIMIT", "GODEBUG", "GOMAXPROCS":
			continue
		}
		env = append(env, kv)
	}
	debug := "GODEBUG=gctrace=1"
	for _, kv := range extra {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			debug += "," + v
			continue
		}
		env = append(env, kv)
	}
	return append(env, debug)
}

func (r *runner) startUpstream(ctx context.Context) error {
	cf := filepath.Join(r.dir, "upstream.Corefile")
	if err := os.WriteFile(cf, []byte(upstreamCorefile(r.p, r.zone)), 0o644); err != nil {
		return err
	}
	p, err := r.launch(r.o.clientCore, nil).Start(filepath.Join(r.dir, "logs", "upstream.log"), r.bin, "-conf", cf, "-quiet")
	if err != nil {
		return err
	}
	r.upstream = p
	// The zone loads before the server listens; give a large zone time.
	m, err := harness.WaitDNS(ctx, p, r.upstreamAddr(), workload.Question(0), 5*time.Minute, 200*time.Millisecond)
	if err != nil {
		return fmt.Errorf("upstream: %v", err)
	}
	if err := checkAnswer(m, 0); err != nil {
		return fmt.Errorf("upstream: %v", err)
	}
	if r.upstreamRequests() < 0 {
		return fmt.Errorf("upstream: no request count from its prometheus endpoint")
	}
	log.Printf("upstream ready: pid %d, %d entries", p.Pid(), r.o.n)
	return nil
}

func (r *runner) serverAddr() string   { return fmt.Sprintf("127.0.0.1:%d", r.p.server) }
func (r *runner) upstreamAddr() string { return fmt.Sprintf("127.0.0.1:%d", r.p.upstream) }

// upstreamRequests returns the queries the upstream has received, -1 if its
// metrics cannot be read.
func (r *runner) upstreamRequests() int {
	text, err := get(context.Background(), fmt.Sprintf("http://127.0.0.1:%d/metrics", r.p.upMetrics))
	if err != nil {
		return -1
	}
	return sumMetric(text, "coredns_dns_requests_total")
}

// sumMetric adds up the samples of a counter in Prometheus' text format.
func sumMetric(text, name string) int {
	total, found := 0.0, false
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		total += v
		found = true
	}
	if !found {
		return 0
	}
	return int(total)
}

// checkAnswer checks that m answers entry i with its records, in any order
// (loadbalance shuffles them), with a TTL no higher than the workload's.
func checkAnswer(m *dns.Msg, i int) error {
	want := workload.Reply(i, workload.Plain).Answer
	if m.Rcode != dns.RcodeSuccess {
		return fmt.Errorf("entry %d: rcode %s", i, dns.RcodeToString[m.Rcode])
	}
	if m.Truncated {
		return fmt.Errorf("entry %d: truncated", i)
	}
	if len(m.Answer) != len(want) {
		return fmt.Errorf("entry %d: %d answers, want %d", i, len(m.Answer), len(want))
	}
	used := make([]bool, len(want))
next:
	for _, rr := range m.Answer {
		if rr.Header().Ttl > workload.TTL {
			return fmt.Errorf("entry %d: TTL %d", i, rr.Header().Ttl)
		}
		for j, w := range want {
			if !used[j] && dns.IsDuplicate(rr, w) {
				used[j] = true
				continue next
			}
		}
		return fmt.Errorf("entry %d: unexpected answer %v", i, rr)
	}
	return nil
}

// phase is one dnsperf run against the server under test.
type phase struct {
	Name      string
	Rate      int // queries/s asked for, 0 for as many as the server answers
	Perf      harness.Perf
	ServerCPU time.Duration
	Upstream  int     // queries the upstream received during the phase
	GC        gcTrace // the server's GC cycles during the phase
	Wall      time.Duration
	Waited    time.Duration      // waiting for quiet cores before the phase
	Quiet     bool               // the cores were quiet when the phase began
	RT        bool               // the server and dnsperf ran under SCHED_RR
	Cores     [2]harness.CPULoad // the server's core and the client's, during the phase
	Err       string             `json:",omitempty"`
}

// foreign is the share of the server's core that something other than the
// server used during the phase (other processes, interrupts, time stolen
// by the hypervisor).
func (p *phase) foreign() float64 {
	if p == nil || p.Wall <= 0 {
		return 0
	}
	return max(0, float64(p.Cores[0].Busy+p.Cores[0].Steal-p.ServerCPU)/float64(p.Wall))
}

// cpuPerQuery is the server's CPU time per answered query, in µs.
func (p *phase) cpuPerQuery() float64 {
	if p == nil || p.Perf.Completed == 0 {
		return 0
	}
	return float64(p.ServerCPU) / float64(time.Microsecond) / float64(p.Perf.Completed)
}

// gcPerQuery is the server's GC CPU time per answered query, in µs.
func (p *phase) gcPerQuery() float64 {
	if p == nil || p.Perf.Completed == 0 {
		return 0
	}
	return float64(p.GC.CPU) / float64(time.Microsecond) / float64(p.Perf.Completed)
}

// hitRatio is the share of answered queries that did not reach the upstream.
func (p *phase) hitRatio() float64 {
	if p == nil || p.Perf.Completed == 0 || p.Upstream < 0 {
		return 0
	}
	return 1 - float64(p.Upstream)/float64(p.Perf.Completed)
}

// result is what one config measured.
type result struct {
	Round      int
	Config     config
	Corefile   string
	GOMAXPROCS string           `json:",omitempty"`
	RSSStart   int64            // bytes, before the fill
	RSSFill    int64            // after the fill
	RSSEnd     int64            // after the hit phases
	HeapStart  map[string]int64 // runtime.MemStats after a forced GC, before the fill
	HeapFill   map[string]int64 // and after
	// StoreBytes and StoreEntries are compactcache's bytes and entries
	// metrics after the fill, where the Corefile has prometheus.
	StoreBytes   int
	StoreEntries int
	Fills        []phase
	Verified     int
	Max          *phase
	Rates        []phase
	Err          string `json:",omitempty"`
}

// rssEndPerEntry is the RSS growth per entry from before the fill to after
// the hit phases, when transient memory of the fill may have gone.
func (res *result) rssEndPerEntry(n int) float64 {
	if res.RSSEnd == 0 || res.RSSStart == 0 {
		return 0
	}
	return float64(res.RSSEnd-res.RSSStart) / float64(n)
}

func (res *result) rssPerEntry(n int) float64 {
	if res.RSSFill == 0 || res.RSSStart == 0 {
		return 0
	}
	return float64(res.RSSFill-res.RSSStart) / float64(n)
}

// storePerEntry is the bytes compactcache accounts per entry it holds.
func (res *result) storePerEntry() float64 {
	if res.StoreEntries == 0 {
		return 0
	}
	return float64(res.StoreBytes) / float64(res.StoreEntries)
}

// heapPerEntry is the growth of the Go heap in use (after GC) per entry.
func (res *result) heapPerEntry(n int) float64 {
	a, b := res.HeapStart["HeapInuse"], res.HeapFill["HeapInuse"]
	if a == 0 || b == 0 {
		return 0
	}
	return float64(b-a) / float64(n)
}

func (res *result) rate(q int) *phase {
	for i := range res.Rates {
		if res.Rates[i].Rate == q {
			return &res.Rates[i]
		}
	}
	return nil
}

// probeName is outside the workload: the upstream answers NXDOMAIN.
const probeName = "probe.e2e.invalid."

// memStats forces a GC in the server under test and returns its
// runtime.MemStats, through the pprof plugin's heap profile.
//
// It asks twice: objects in sync.Pools (compactcache's builders and reply
// writers) survive one GC in the pools' victim caches and go at the second,
// as runtime.GC() twice does in bench/report.
func (r *runner) memStats(ctx context.Context) (map[string]int64, error) {
	url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap?gc=1&debug=1", r.p.pprof)
	if _, err := get(ctx, url); err != nil {
		return nil, err
	}
	text, err := get(ctx, url)
	if err != nil {
		return nil, err
	}
	return parseMemStats(text), nil
}

// get returns the body of an HTTP GET on the loopback.
func get(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), nil
}

// parseMemStats reads the "# Name = value" lines that end a heap profile
// in text form.
func parseMemStats(text string) map[string]int64 {
	m := map[string]int64{}
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "# "), " = ")
		if !ok || !strings.HasPrefix(line, "# ") {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			m[k] = n
		}
	}
	return m
}

func isUnbound(c config) bool { return c.Kind == kindUnbound }

// unboundPath finds the unbound binary, which Debian installs in /usr/sbin.
func unboundPath() (string, error) {
	if p, err := exec.LookPath("unbound"); err == nil {
		return p, nil
	}
	const sbin = "/usr/sbin/unbound"
	if _, err := os.Stat(sbin); err == nil {
		return sbin, nil
	}
	return "", fmt.Errorf("unbound not found: run bench/e2e/run.sh, which installs what the run needs")
}

// startServer writes c's Corefile (unbound.conf for unbound) and starts the
// server under test on its core, waiting until it answers.
func (r *runner) startServer(ctx context.Context, c config, tag string, pprof bool) (*harness.Proc, string, string, error) {
	name := strings.NewReplacer("@", "_", ",", "_", "=", "-").Replace(c.Spec) + tag
	logPath := filepath.Join(r.dir, "logs", name+".server.log")
	var text, conf string
	var argv []string
	if c.Kind == kindUnbound {
		// In the foreground (-d), logging to a file of its own.
		text = unboundConf(r.p, r.dir, filepath.Join(r.dir, "logs", name+".unbound.log"))
		conf = filepath.Join(r.dir, name+".unbound.conf")
		argv = []string{r.unbound, "-d", "-c", conf}
	} else {
		var err error
		if text, err = corefile(c.Kind, r.p, r.cs, pprof); err != nil {
			return nil, "", "", err
		}
		conf = filepath.Join(r.dir, name+".Corefile")
		argv = []string{r.binOf(c), "-conf", conf, "-quiet"}
	}
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return nil, "", "", err
	}
	p, err := r.launch(r.o.serverCore, c.Env).Start(logPath, argv[0], argv[1:]...)
	if err != nil {
		return nil, "", "", err
	}
	// A name outside the workload: NXDOMAIN from the upstream, one denial
	// entry in the cache.
	if _, err := harness.WaitDNS(ctx, p, r.serverAddr(), dns.Question{Name: probeName, Qtype: dns.TypeA, Qclass: dns.ClassINET}, time.Minute, 200*time.Millisecond); err != nil {
		p.Stop(5 * time.Second)
		return nil, "", "", err
	}
	_, r.gcOff = readGCs(logPath, 0)
	return p, text, name, nil
}

func (r *runner) perfArgs(file string, extra ...string) []string {
	return append([]string{"-s", "127.0.0.1", "-p", strconv.Itoa(r.p.server), "-d", file, "-e", "-t", "3", "-c", strconv.Itoa(r.o.clients), "-T", "1"}, extra...)
}

// setRT moves every thread of pid to SCHED_RR at rtPriority, or back to
// SCHED_OTHER. Threads the Go runtime starts later inherit the policy of the
// thread that starts them.
func setRT(pid int, on bool) error {
	args := []string{"-a", "-o", "-p", "0", strconv.Itoa(pid)}
	if on {
		args = []string{"-a", "-r", "-p", strconv.Itoa(rtPriority), strconv.Itoa(pid)}
	}
	out, err := exec.Command("chrt", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chrt %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// waitQuiet waits, up to -quiet-wait, for a second in which the server's
// core was at most 10% busy with anything but the (idle) server and the
// client's core at most 25% busy: the machine is shared, and a phase run
// beside someone's build measures the build too.
func (r *runner) waitQuiet(ctx context.Context, srv *harness.Proc) (time.Duration, bool) {
	start := time.Now()
	cores := []int{r.o.serverCore, r.o.clientCore}
	for {
		l0 := harness.CoreLoads(cores)
		c0, _ := harness.CPUTime(srv.Pid())
		t0 := time.Now()
		select {
		case <-ctx.Done():
			return time.Since(start), false
		case <-time.After(time.Second):
		}
		l1 := harness.CoreLoads(cores)
		c1, _ := harness.CPUTime(srv.Pid())
		wall := float64(time.Since(t0))
		server := l1[0].Sub(l0[0])
		client := l1[1].Sub(l0[1])
		other := float64(server.Busy+server.Steal-(c1-c0)) / wall
		if other <= 0.10 && float64(client.Busy+client.Steal)/wall <= 0.25 {
			return time.Since(start), true
		}
		if time.Since(start) >= r.o.quietWait {
			return time.Since(start), false
		}
	}
}

// runPhase runs dnsperf against srv and takes the server's CPU time, the
// upstream's request count and the GC cycles around it.
func (r *runner) runPhase(ctx context.Context, srv *harness.Proc, logName, name string, rate int, args []string) phase {
	ph := phase{Name: name, Rate: rate}
	if r.o.quietWait > 0 && (name == "max" || rate > 0) {
		ph.Waited, ph.Quiet = r.waitQuiet(ctx, srv)
		if !ph.Quiet {
			log.Printf("%s: the cores were still busy after %v; measuring anyway", name, ph.Waited.Round(time.Second))
		}
	}
	up0 := r.upstreamRequests()
	_, r.gcOff = readGCs(srv.Log, r.gcOff)
	cores := []int{r.o.serverCore, r.o.clientCore}
	load0 := harness.CoreLoads(cores)
	cpu0, err0 := harness.CPUTime(srv.Pid())
	start := time.Now()
	rt := r.o.rtRates && rate > 0 || r.o.rtMax && name == "max"
	if rt {
		ph.RT = setRT(srv.Pid(), true) == nil
	}
	argv := harness.Pinned(r.o.clientCore, niceness, "dnsperf", args...)
	if rt {
		argv = append([]string{"chrt", "-r", strconv.Itoa(rtPriority)}, argv...)
	}
	pf, err := harness.DNSPerf(ctx, argv, filepath.Join(r.dir, "logs", logName))
	if rt {
		if err := setRT(srv.Pid(), false); err != nil {
			log.Printf("%s: back to SCHED_OTHER: %v", name, err)
		}
	}
	ph.Wall = time.Since(start)
	cpu1, err1 := harness.CPUTime(srv.Pid())
	load1 := harness.CoreLoads(cores)
	for k := range cores {
		ph.Cores[k] = load1[k].Sub(load0[k])
	}
	up1 := r.upstreamRequests()
	ph.GC, r.gcOff = readGCs(srv.Log, r.gcOff)
	ph.Perf = pf
	ph.ServerCPU = cpu1 - cpu0
	ph.Upstream = -1
	if up0 >= 0 && up1 >= 0 {
		ph.Upstream = up1 - up0
	}
	switch {
	case err != nil:
		ph.Err = err.Error()
	case err0 != nil || err1 != nil:
		ph.Err = fmt.Sprintf("server CPU time: %v %v", err0, err1)
	}
	return ph
}

func (r *runner) measure(ctx context.Context, c config) (res result) {
	res.Config = c
	// pprof sits outside the chain; it serves the MemStats above.
	srv, text, name, err := r.startServer(ctx, c, "", true)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer srv.Stop(10 * time.Second)
	res.Corefile = text
	res.GOMAXPROCS = gomaxprocs(srv.Log)
	fail := func(format string, args ...any) result {
		res.Err = fmt.Sprintf(format, args...)
		return res
	}

	if cached(c.Kind) {
		// Warm up: hits on one name (the probe's cached NXDOMAIN) bring the
		// server's buffers, stacks and heap to their working size, so that
		// the RSS before the fill holds them and the difference holds the
		// entries.
		args := r.perfArgs(r.warm, "-q", strconv.Itoa(r.o.outstanding), "-l", "3")
		if ph := r.runPhase(ctx, srv, name+".warm.txt", "warm-up", 0, args); ph.Err != "" {
			return fail("warm-up: %s", ph.Err)
		}
		time.Sleep(time.Second)
		if res.RSSStart, err = harness.RSS(srv.Pid()); err != nil {
			return fail("rss: %v", err)
		}
		if goServer(c.Kind) {
			res.HeapStart, _ = r.memStats(ctx)
		}

		// One pass of every query; again if dnsperf lost some, so that all N
		// entries are stored before the RSS is read.
		for pass := 1; pass <= 3; pass++ {
			args := r.perfArgs(r.fill, "-n", "1", "-q", "100", "-l", "600")
			ph := r.runPhase(ctx, srv, fmt.Sprintf("%s.fill%d.txt", name, pass), fmt.Sprintf("fill %d", pass), 0, args)
			res.Fills = append(res.Fills, ph)
			log.Printf("%s: fill %d: %d of %d answered in %.1f s, upstream asked %d times", c.Spec, pass, ph.Perf.Completed, ph.Perf.Sent, ph.Perf.Seconds, ph.Upstream)
			if ph.Err != "" {
				return fail("fill: %s", ph.Err)
			}
			if ph.Perf.Lost == 0 {
				break
			}
		}
		time.Sleep(2 * time.Second)
		if res.RSSFill, err = harness.RSS(srv.Pid()); err != nil {
			return fail("rss: %v", err)
		}
		if goServer(c.Kind) {
			res.HeapFill, _ = r.memStats(ctx)
		}
		if c.Kind == kindKubeCompact {
			if text, err := get(ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", r.p.metrics)); err == nil {
				res.StoreBytes = sumMetric(text, "coredns_compactcache_bytes")
				res.StoreEntries = sumMetric(text, "coredns_cache_entries")
				log.Printf("%s: compactcache holds %d entries in %d bytes", c.Spec, res.StoreEntries, res.StoreBytes)
			}
		}
		if res.Verified, err = r.verify(ctx); err != nil {
			return fail("verify: %v", err)
		}
		log.Printf("%s: RSS %.1f -> %.1f MiB: %.0f bytes per entry; heap in use after GC %.1f -> %.1f MiB: %.0f bytes per entry; %d cached replies verified", c.Spec,
			mib(res.RSSStart), mib(res.RSSFill), res.rssPerEntry(r.o.n),
			mib(res.HeapStart["HeapInuse"]), mib(res.HeapFill["HeapInuse"]), res.heapPerEntry(r.o.n), res.Verified)
	}

	secs := strconv.Itoa(int(r.o.duration.Seconds()))
	maxPhase := r.runPhase(ctx, srv, name+".max.txt", "max", 0, r.perfArgs(r.hit, "-q", strconv.Itoa(r.o.outstanding), "-l", secs))
	res.Max = &maxPhase
	log.Printf("%s: max: %.0f q/s, server %.2f µs/q, dnsperf CPU %.0f%%, %d lost, upstream asked %d times, %d GCs",
		c.Spec, maxPhase.Perf.QPS, maxPhase.cpuPerQuery(), 100*maxPhase.Perf.ClientCPU.Seconds()/maxPhase.Perf.Seconds, maxPhase.Perf.Lost, maxPhase.Upstream, maxPhase.GC.Cycles)
	if maxPhase.Err != "" {
		return fail("max: %s", maxPhase.Err)
	}
	for _, q := range r.o.rates {
		if ctx.Err() != nil {
			return fail("%v", ctx.Err())
		}
		ph := r.runPhase(ctx, srv, fmt.Sprintf("%s.rate%d.txt", name, q), fmt.Sprintf("%d/s", q), q,
			r.perfArgs(r.hit, "-q", "5000", "-Q", strconv.Itoa(q), "-l", secs, "-v"))
		res.Rates = append(res.Rates, ph)
		if l := ph.Perf.Lat; l != nil {
			log.Printf("%s: %d/s: p50 %.0f µs, p99 %.0f µs, p99.9 %.0f µs, server %.2f µs/q, %d lost, upstream asked %d times",
				c.Spec, q, l.P50, l.P99, l.P999, ph.cpuPerQuery(), ph.Perf.Lost, ph.Upstream)
		}
		if ph.Err != "" {
			return fail("%d/s: %s", q, ph.Err)
		}
	}
	res.RSSEnd, _ = harness.RSS(srv.Pid())
	return res
}

// verify asks the server for a fixed sample of entries and checks each
// reply against the workload. The entries are cached, so these are hits.
func (r *runner) verify(ctx context.Context) (int, error) {
	c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
	rng := rand.New(rand.NewPCG(7, 11))
	k := min(r.o.verify, r.o.n)
	for range k {
		i := rng.IntN(r.o.n)
		m := workload.NewRequest(i, workload.Plain)
		resp, _, err := c.ExchangeContext(ctx, m, r.serverAddr())
		if err != nil {
			return 0, fmt.Errorf("entry %d: %v", i, err)
		}
		if err := checkAnswer(resp, i); err != nil {
			return 0, err
		}
	}
	return k, nil
}

// profileResult is a CPU profile of a server under hit load.
type profileResult struct {
	Config  config
	Phase   phase
	Profile string // the pprof file
	Top     string // go tool pprof -top
	Cum     string // go tool pprof -top -cum
	Err     string `json:",omitempty"`
}

func (r *runner) profile(ctx context.Context, c config) (pr profileResult) {
	pr.Config = c
	if !goServer(c.Kind) {
		pr.Err = "not a Go server: no pprof endpoint to profile"
		return pr
	}
	srv, _, name, err := r.startServer(ctx, c, ".profile", true)
	if err != nil {
		pr.Err = err.Error()
		return pr
	}
	defer srv.Stop(10 * time.Second)
	if cached(c.Kind) {
		ph := r.runPhase(ctx, srv, name+".fill.txt", "fill", 0, r.perfArgs(r.fill, "-n", "1", "-q", "100", "-l", "600"))
		if ph.Err != "" {
			pr.Err = "fill: " + ph.Err
			return pr
		}
	}
	// dnsperf runs 3 s before and after the profile. The wait for quiet
	// cores comes first: inside the phase it would delay dnsperf past the
	// start of the profile, which would then sample an idle server.
	if r.o.quietWait > 0 {
		if waited, quiet := r.waitQuiet(ctx, srv); !quiet {
			log.Printf("profile %s: the cores were still busy after %v; profiling anyway", c.Spec, waited.Round(time.Second))
		}
	}
	load := r.o.profileTime + 6*time.Second
	done := make(chan phase, 1)
	go func() {
		done <- r.runPhase(ctx, srv, name+".txt", "profile", 0, r.perfArgs(r.hit, "-q", strconv.Itoa(r.o.outstanding), "-l", strconv.Itoa(int(load.Seconds()))))
	}()
	time.Sleep(3 * time.Second)
	pr.Profile = filepath.Join(r.dir, name+".pprof")
	perr := fetch(ctx, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", r.p.pprof, int(r.o.profileTime.Seconds())), pr.Profile)
	pr.Phase = <-done
	if perr != nil {
		pr.Err = perr.Error()
		return pr
	}
	log.Printf("profile %s: %.0f q/s, server %.2f µs/q", c.Spec, pr.Phase.Perf.QPS, pr.Phase.cpuPerQuery())
	for _, v := range []struct {
		dst  *string
		args []string
	}{
		{&pr.Top, []string{"tool", "pprof", "-top", "-nodecount=45", r.binOf(c), pr.Profile}},
		{&pr.Cum, []string{"tool", "pprof", "-top", "-cum", "-nodecount=45", r.binOf(c), pr.Profile}},
	} {
		out, err := exec.CommandContext(ctx, "go", v.args...).Output()
		if err != nil {
			pr.Err = fmt.Sprintf("go %s: %v", strings.Join(v.args, " "), err)
			return pr
		}
		*v.dst = string(out)
	}
	return pr
}

func fetch(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// gomaxprocs returns what the server printed about GOMAXPROCS at start.
func gomaxprocs(logPath string) string {
	b, _ := os.ReadFile(logPath)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "GOMAXPROCS") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func (rep *report) save(dir string) {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644)
	}
	if err == nil {
		var f *os.File
		if f, err = os.Create(filepath.Join(dir, "results.md")); err == nil {
			err = rep.write(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		log.Printf("saving results: %v", err)
	}
	if len(rep.rates()) > 0 {
		if err := rep.writePlot(filepath.Join(dir, "cpu-per-query.png")); err != nil {
			log.Printf("plotting: %v", err)
		}
	}
}
