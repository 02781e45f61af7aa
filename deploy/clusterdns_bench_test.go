package deploy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// BenchmarkClusterDomain sets the kube-dns Corefile of coredns.yaml, which
// caches the cluster zone for the kubernetes plugin's TTL (30 s) and drops
// what a change makes wrong, beside kubeadm's default Corefile, which does
// not cache the cluster zone at all (`disable success cluster.local`,
// `disable denial cluster.local`), both against a real API server holding
// a thousand Services. It prints
//
//   - the server CPU per cluster-domain query under the same offered load
//     (dnsperf at -Q), the median of interleaved rounds, and its ratio to
//     kubeadm's; the stock cache caching the cluster zone too (answers
//     stale for up to 30 s) for scale;
//   - the staleness window over 100 changes (a headless Service's
//     EndpointSlice, a Service created where its name was cached as
//     NXDOMAIN, a Service deleted and created again at another ClusterIP):
//     from the moment the last write is sent to the API server to the first
//     fresh answer, p50 and max.
//
// CLUSTERDNS_RATE sets another rate than 10,000 q/s. It runs once whatever
// b.N (the figures are its report, not ns/op):
//
//	deploy/apiserver/run.sh build
//	go test -run '^$' -bench ClusterDomain -benchtime 1x -timeout 20m ./deploy
func BenchmarkClusterDomain(b *testing.B) {
	if _, err := exec.LookPath("dnsperf"); err != nil {
		b.Skip("dnsperf not on PATH: apt-get install dnsperf")
	}
	rate, seconds, rounds := 10000, 10, 3
	if v, err := strconv.Atoi(os.Getenv("CLUSTERDNS_RATE")); err == nil {
		rate = v
	}
	cp := startControlPlane(b)
	bin := corednsBinary(b)
	tokenFile := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("compactcache-bench-token-0123456789\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	applyManifests(b, cp, tokenFile)
	api := newBenchCluster(b, cp)
	api.create(b)

	kubeconfig := cp.serviceAccountKubeconfig(b, "kube-system", "coredns")
	clusterCF := configMapCorefile(b, "coredns.yaml", "coredns-compactcache")
	ours := startClusterDNS(b, bin, clusterCF, kubeconfig, tokenFile, "", 0)
	kubeadm := startClusterDNS(b, bin, kubeadmCorefile(b, clusterCF), kubeconfig, tokenFile, "", 0)
	kubeadm.name = "cache, cluster not cached (kubeadm)"
	cached := startClusterDNS(b, bin, stockCorefile(clusterCF), kubeconfig, tokenFile, "", 0)
	cached.name = "cache, cluster cached"
	plugin := *ours
	plugin.name, plugin.addr = "compactcache block", fmt.Sprintf("127.0.0.1:%d", ours.rw.dnsPort)
	ours.name = "compactcache front end"

	queries := filepath.Join(b.TempDir(), "queries")
	if err := os.WriteFile(queries, []byte(api.queryFile()), 0o600); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()

	// 1. CPU per query: each server in turn under the same load, a short
	// run first so that the caches hold what the load asks.
	servers := []*dnsServer{ours, &plugin, kubeadm, cached}
	perQuery := map[*dnsServer][]float64{}
	codes := map[*dnsServer]string{}
	for _, s := range servers {
		runDNSPerf(b, s, queries, rate, 2)
	}
	for range rounds {
		for _, s := range servers {
			before := processCPU(b, s.in)
			r := runDNSPerf(b, s, queries, rate, seconds)
			cpu := processCPU(b, s.in) - before
			if r.lost*100 > r.completed {
				b.Errorf("%s: %d of %d queries lost", s.name, r.lost, r.completed+r.lost)
			}
			perQuery[s] = append(perQuery[s], cpu.Seconds()*1e6/float64(r.completed))
			codes[s] = r.codes
		}
	}
	for _, s := range servers[1:] {
		if !sameShares(codes[s], codes[ours]) {
			b.Errorf("%s answered %s, %s %s: not the same answers", s.name, codes[s], ours.name, codes[ours])
		}
	}
	base := median(perQuery[kubeadm])
	b.Logf("server CPU per cluster-domain query at %d q/s (%d rounds of %d s, median), %d Services (%d headless); answers %s", rate, rounds, seconds, api.services+api.headless, api.headless, codes[ours])
	for _, s := range servers {
		m := median(perQuery[s])
		b.Logf("  %-40s %6.2f µs  %.2fx   rounds %s", s.name, m, m/base, roundsText(perQuery[s]))
	}
	b.ReportMetric(median(perQuery[ours])/base, "frontend/kubeadm-cpu")
	b.ReportMetric(median(perQuery[&plugin])/base, "block/kubeadm-cpu")

	// 2. Staleness: one change at a time, both servers asked every 5 ms
	// from just before the last write is sent, under a light load.
	watched := []*dnsServer{ours, kubeadm}
	stopLoad := backgroundDNSPerf(b, watched, queries, 1000)
	windows := map[*dnsServer][]time.Duration{}
	jitter := rand.New(rand.NewPCG(3, 4))
	for i := range 100 {
		// A change comes at any moment, not in step with the polls that
		// showed the last one.
		time.Sleep(time.Duration(jitter.IntN(200)) * time.Millisecond)
		c := api.change(b, i)
		for _, s := range watched {
			if got := askLines(s.addr, c.name, c.qtype); !slices.Equal(got, c.old) {
				b.Fatalf("%s: change %d: %s %s answers %v before the change, want %v", s.name, i, c.name, dns.TypeToString[c.qtype], got, c.old)
			}
		}
		var wg sync.WaitGroup
		got := make([]time.Duration, len(watched))
		sent := time.Now()
		for j, s := range watched {
			wg.Go(func() { got[j] = waitFresh(s.addr, c, sent, 40*time.Second) })
		}
		c.write(b)
		wg.Wait()
		for j, s := range watched {
			if got[j] < 0 {
				b.Errorf("%s: change %d (%s): %s %s never answered %v", s.name, i, c.kind, c.name, dns.TypeToString[c.qtype], c.fresh)
				continue
			}
			windows[s] = append(windows[s], got[j])
		}
		if got[0] > time.Second {
			b.Errorf("%s: change %d (%s): the fresh answer %v after it, want within 1s", ours.name, i, c.kind, got[0])
		}
	}
	stopLoad()
	b.Logf("staleness over 100 changes (EndpointSlice, created after NXDOMAIN, recreated at another ClusterIP), from the write to the first fresh answer:")
	for _, s := range watched {
		w := windows[s]
		slices.Sort(w)
		if len(w) == 0 {
			continue
		}
		b.Logf("  %-40s p50 %4d ms  max %4d ms", s.name, w[len(w)/2].Milliseconds(), w[len(w)-1].Milliseconds())
		if s == ours {
			b.ReportMetric(float64(w[len(w)/2].Milliseconds()), "stale-p50-ms")
			b.ReportMetric(float64(w[len(w)-1].Milliseconds()), "stale-max-ms")
		}
	}
}

// kubeadmCorefile is the cluster Corefile as kubeadm writes it today: the
// stock cache, which does not cache the cluster zone.
func kubeadmCorefile(t testing.TB, corefile string) string {
	t.Helper()
	stock := stockCorefile(corefile)
	const line = "    cache 30\n"
	if strings.Count(stock, line) != 1 {
		t.Fatalf("no %q in\n%s", line, stock)
	}
	return strings.Replace(stock, line, "    cache 30 {\n        disable success cluster.local\n        disable denial cluster.local\n    }\n", 1)
}

// benchCluster is the namespace of Services the benchmark asks about:
// services with a ClusterIP each (svc-N) and headless ones with three
// endpoints (hl-N).
type benchCluster struct {
	client   *kubernetes.Clientset
	ns       string
	services int
	headless int
}

func newBenchCluster(t testing.TB, cp *controlPlane) *benchCluster {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 500, 500
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &benchCluster{client: client, ns: "bench", services: 900, headless: 100}
}

func (c *benchCluster) svcName(i int) string {
	return fmt.Sprintf("svc-%d.%s.svc.cluster.local.", i, c.ns)
}
func (c *benchCluster) hlName(i int) string {
	return fmt.Sprintf("hl-%d.%s.svc.cluster.local.", i, c.ns)
}

// svcIP is svc-N's ClusterIP, chosen here so that a change can name its
// next one; recreated Services take theirs from 10.96.200.0/24.
func svcIP(i int) string { return fmt.Sprintf("10.96.%d.%d", 100+i/250, 1+i%250) }

// endpointIP is the address of endpoint e of hl-N at generation g.
func endpointIP(i, e, g int) string { return fmt.Sprintf("10.%d.%d.%d", 2+g, i, 1+e) }

func (c *benchCluster) create(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	work := make(chan func() error)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				if err := f(); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < c.services; i++ {
		work <- func() error { return c.createService(ctx, fmt.Sprintf("svc-%d", i), svcIP(i)) }
	}
	for i := 0; i < c.headless; i++ {
		work <- func() error {
			if err := c.createService(ctx, fmt.Sprintf("hl-%d", i), corev1.ClusterIPNone); err != nil {
				return err
			}
			return c.writeSlice(ctx, i, 0)
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	t.Logf("%d Services and %d EndpointSlices created in %v", c.services+c.headless, c.headless, time.Since(begin).Round(100*time.Millisecond))
}

func (c *benchCluster) createService(ctx context.Context, name, ip string) error {
	_, err := c.client.CoreV1().Services(c.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			ClusterIP: ip,
			Ports:     []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	return err
}

// writeSlice writes hl-N's EndpointSlice with the addresses of generation g.
func (c *benchCluster) writeSlice(ctx context.Context, i, g int) error {
	ready := true
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("hl-%d-1", i), Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("hl-%d", i)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(80)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for e := 0; e < 3; e++ {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{endpointIP(i, e, g)}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	api := c.client.DiscoveryV1().EndpointSlices(c.ns)
	if g == 0 {
		_, err := api.Create(ctx, s, metav1.CreateOptions{})
		return err
	}
	_, err := api.Update(ctx, s, metav1.UpdateOptions{})
	return err
}

// queryFile is what the load asks, as a pod's resolver asks with the
// cluster's search path (ndots 5) from namespace default: for each
// Service name, A and AAAA (an IPv4-only Service: NODATA), both first
// under the search path's first suffix (NXDOMAIN); SRV and PTR for one
// in ten. Shuffled, the same every run.
func (c *benchCluster) queryFile() string {
	var lines []string
	add := func(name string) {
		search := strings.TrimSuffix(name, "svc.cluster.local.") + "default.svc.cluster.local."
		lines = append(lines, name+" A", name+" AAAA", search+" A", search+" AAAA")
	}
	for i := 0; i < c.services; i++ {
		add(c.svcName(i))
		if i%10 == 0 {
			ip := net.ParseIP(svcIP(i))
			rev, _ := dns.ReverseAddr(ip.String())
			lines = append(lines, "_http._tcp."+c.svcName(i)+" SRV", rev+" PTR")
		}
	}
	for i := 0; i < c.headless; i++ {
		add(c.hlName(i))
	}
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(lines), func(i, j int) { lines[i], lines[j] = lines[j], lines[i] })
	return strings.Join(lines, "\n") + "\n"
}

// clusterChange is one change of the staleness run: the question that
// shows it, its answer before and after, and the writes that make it.
type clusterChange struct {
	kind       string
	name       string
	qtype      uint16
	old, fresh []string
	write      func(t testing.TB) // the last write, timed
}

// change prepares change i (its earlier writes done) of one of three
// kinds in turn, each on names no earlier change touched.
func (c *benchCluster) change(t testing.TB, i int) clusterChange {
	t.Helper()
	ctx := context.Background()
	k := i / 3
	a := func(name string, ips ...string) []string {
		out := []string{"NOERROR"}
		for _, ip := range ips {
			out = append(out, name+" A "+ip)
		}
		slices.Sort(out[1:])
		return out
	}
	switch i % 3 {
	case 0: // a headless Service's endpoints move
		name := c.hlName(k)
		return clusterChange{kind: "EndpointSlice", name: name, qtype: dns.TypeA,
			old:   a(name, endpointIP(k, 0, 0), endpointIP(k, 1, 0), endpointIP(k, 2, 0)),
			fresh: a(name, endpointIP(k, 0, 1), endpointIP(k, 1, 1), endpointIP(k, 2, 1)),
			write: func(t testing.TB) {
				if err := c.writeSlice(ctx, k, 1); err != nil {
					t.Fatal(err)
				}
			}}
	case 1: // a Service where the name was NXDOMAIN
		svc := fmt.Sprintf("new-%d", k)
		name := svc + "." + c.ns + ".svc.cluster.local."
		ip := fmt.Sprintf("10.96.201.%d", 1+k)
		return clusterChange{kind: "created", name: name, qtype: dns.TypeA,
			old: []string{"NXDOMAIN"}, fresh: a(name, ip),
			write: func(t testing.TB) {
				if err := c.createService(ctx, svc, ip); err != nil {
					t.Fatal(err)
				}
			}}
	default: // a Service deleted and created again at another ClusterIP
		svc := fmt.Sprintf("svc-%d", k)
		name := c.svcName(k)
		ip := fmt.Sprintf("10.96.200.%d", 1+k)
		return clusterChange{kind: "recreated", name: name, qtype: dns.TypeA,
			old: a(name, svcIP(k)), fresh: a(name, ip),
			write: func(t testing.TB) {
				if err := c.client.CoreV1().Services(c.ns).Delete(ctx, svc, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				if err := c.createService(ctx, svc, ip); err != nil {
					t.Fatal(err)
				}
			}}
	}
}

// waitFresh asks addr every 5 ms until it answers c.fresh and returns how
// long after sent that answer's question was asked, or -1 after limit.
func waitFresh(addr string, c clusterChange, sent time.Time, limit time.Duration) time.Duration {
	for time.Since(sent) < limit {
		at := time.Now()
		if slices.Equal(askLines(addr, c.name, c.qtype), c.fresh) {
			return max(at.Sub(sent), 0)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return -1
}

// askLines is an answer as answer.lines has it, or the error.
func askLines(addr, name string, qtype uint16) []string {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	cl := &dns.Client{Timeout: time.Second}
	r, _, err := cl.Exchange(m, addr)
	if err != nil {
		return []string{err.Error()}
	}
	return answerOf(r).lines
}

// processCPU is the user and system CPU the process has used.
func processCPU(t testing.TB, in *instance) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", in.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: utime and stime are the 14th and 15th of the line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

type perfResult struct {
	completed, lost int
	codes           string // "Response codes:" as dnsperf prints it
}

var perfField = regexp.MustCompile(`(?m)^\s*(Queries completed|Queries lost|Response codes):\s*(.*)$`)

// runDNSPerf offers s rate queries a second from file for seconds.
func runDNSPerf(t testing.TB, s *dnsServer, file string, rate, seconds int) perfResult {
	t.Helper()
	host, port, _ := net.SplitHostPort(s.addr)
	out, err := exec.Command("dnsperf", "-s", host, "-p", port, "-d", file, "-Q", fmt.Sprint(rate), "-l", fmt.Sprint(seconds), "-q", "500", "-t", "2").CombinedOutput()
	if err != nil {
		t.Fatalf("dnsperf against %s: %v\n%s", s.name, err, out)
	}
	var r perfResult
	for _, m := range perfField.FindAllStringSubmatch(string(out), -1) {
		n, _ := strconv.Atoi(strings.Fields(m[2])[0])
		switch m[1] {
		case "Queries completed":
			r.completed = n
		case "Queries lost":
			r.lost = n
		case "Response codes":
			r.codes = strings.TrimSpace(m[2])
		}
	}
	if r.completed == 0 {
		t.Fatalf("dnsperf against %s: no query completed\n%s", s.name, out)
	}
	return r
}

// backgroundDNSPerf offers each server rate queries a second until the
// returned function is called.
func backgroundDNSPerf(t testing.TB, servers []*dnsServer, file string, rate int) (stop func()) {
	t.Helper()
	var cmds []*exec.Cmd
	for _, s := range servers {
		host, port, _ := net.SplitHostPort(s.addr)
		cmd := exec.Command("dnsperf", "-s", host, "-p", port, "-d", file, "-Q", fmt.Sprint(rate), "-l", "3600", "-t", "2")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	stop = sync.OnceFunc(func() {
		for _, cmd := range cmds {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	t.Cleanup(stop)
	return stop
}

// sameShares says whether two "Response codes:" lines give each code the
// same percentage, within a point.
func sameShares(a, b string) bool {
	share := regexp.MustCompile(`([A-Z]+) \d+ \(([\d.]+)%\)`)
	m := map[string]float64{}
	for _, s := range share.FindAllStringSubmatch(a, -1) {
		m[s[1]], _ = strconv.ParseFloat(s[2], 64)
	}
	n := 0
	for _, s := range share.FindAllStringSubmatch(b, -1) {
		p, _ := strconv.ParseFloat(s[2], 64)
		if q, ok := m[s[1]]; !ok || q-p > 1 || p-q > 1 {
			return false
		}
		n++
	}
	return n == len(m)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func roundsText(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(s, " ")
}
