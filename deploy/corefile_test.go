package deploy

import (
	"bufio"
	encjson "encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Corefiles of the ConfigMaps, started with the custom build.
//
// Each Corefile runs as written except for what ties it to a cluster, each
// change made by rewriteCorefile and logged:
//
//   - listen addresses: the server blocks' :53, `bind`, and the health,
//     ready and prometheus addresses move to free ports on 127.0.0.1;
//   - the kubernetes block gets `endpoint http://127.0.0.1:PORT`, a fake API
//     server started by the test (in a pod it would use the service
//     account's in-cluster config);
//   - `forward . /etc/resolv.conf` forwards to a fake upstream on
//     127.0.0.1, as KUBE_DNS_UPSTREAM_SERVICE_HOST does for the node-local
//     Corefile: nothing leaves the machine.
//
// Everything else (errors, health's lameduck, ready, the kubernetes
// options, compactcache and its capacity, loop, reload, loadbalance) is the
// Corefile of the manifest. The binary is built from ./cmd/coredns, or taken
// from $COREDNS_BINARY.

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// corednsBinary builds ./cmd/coredns once per test binary.
func corednsBinary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the CoreDNS binary; not in -short")
	}
	binOnce.Do(func() {
		if p := os.Getenv("COREDNS_BINARY"); p != "" {
			binPath = p
			return
		}
		binDir, binErr = os.MkdirTemp("", "deploy-coredns")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "coredns")
		// In cmd/coredns's own module, so that the build needs no go.work.
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Dir = filepath.Join("..", "cmd", "coredns")
		out, err := cmd.CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build ./cmd/coredns: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// fakeUpstream answers A queries with 192.0.2.53 and everything else with
// NXDOMAIN and an SOA, over UDP and TCP on one port, and counts queries.
type fakeUpstream struct {
	addr string
	mu   sync.Mutex
	seen map[string]int
}

func startUpstream(t testing.TB) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{seen: map[string]int{}}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		u.mu.Lock()
		u.seen[strings.ToLower(q.Name)+" "+dns.TypeToString[q.Qtype]]++
		u.mu.Unlock()
		if q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IPv4(192, 0, 2, 53)})
		} else {
			m.Rcode = dns.RcodeNameError
			m.Ns = append(m.Ns, &dns.SOA{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 300},
				Ns: "ns.test.", Mbox: "hostmaster.test.", Serial: 1, Refresh: 3600, Retry: 600, Expire: 86400, Minttl: 300})
		}
		w.WriteMsg(m)
	})
	p := testenv.FreePort(t)
	u.addr = fmt.Sprintf("127.0.0.1:%d", p)
	for _, network := range []string{"udp", "tcp"} {
		started := make(chan error, 1)
		srv := &dns.Server{Addr: u.addr, Net: network, Handler: h, NotifyStartedFunc: func() { started <- nil }}
		go func() {
			if err := srv.ListenAndServe(); err != nil {
				started <- err
			}
		}()
		if err := <-started; err != nil {
			t.Fatalf("fake upstream %s: %v", network, err)
		}
		t.Cleanup(func() { srv.Shutdown() })
	}
	return u
}

func (u *fakeUpstream) count(name string, qtype uint16) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[strings.ToLower(name)+" "+dns.TypeToString[qtype]]
}

// fakeAPIServer serves the lists and watches the kubernetes plugin makes:
// services, endpointslices and namespaces (pods too, though `pods insecure`
// does not watch them), as JSON. Watches stay open without events; a
// streaming list (sendInitialEvents=true) gets the items and the bookmark
// that ends them.
type fakeAPIServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests map[string]int // resource, "list" or "watch"
	unknown  []string
}

func startAPIServer(t testing.TB) *fakeAPIServer {
	t.Helper()
	services := &corev1.ServiceList{
		TypeMeta: metav1.TypeMeta{Kind: "ServiceList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: "1"},
		Items: []corev1.Service{
			service("default", "kubernetes", "10.96.0.1", corev1.ServicePort{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}),
			service("kube-system", "kube-dns", "10.96.0.10", corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}),
		},
	}
	ready := true
	slices := &discoveryv1.EndpointSliceList{
		TypeMeta: metav1.TypeMeta{Kind: "EndpointSliceList", APIVersion: "discovery.k8s.io/v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: "1"},
		Items: []discoveryv1.EndpointSlice{{
			TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default", ResourceVersion: "1",
				Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("https"), Port: ptr(int32(6443)), Protocol: ptr(corev1.ProtocolTCP)}},
		}},
	}
	namespaces := &corev1.NamespaceList{
		TypeMeta: metav1.TypeMeta{Kind: "NamespaceList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: "1"},
		Items:    []corev1.Namespace{namespace("default"), namespace("kube-system")},
	}
	pods := &corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, ListMeta: metav1.ListMeta{ResourceVersion: "1"}}

	lists := map[string]any{
		"/api/v1/services":                         services,
		"/apis/discovery.k8s.io/v1/endpointslices": slices,
		"/api/v1/namespaces":                       namespaces,
		"/api/v1/pods":                             pods,
	}
	items := map[string][]any{
		"/api/v1/services":                         {&services.Items[0], &services.Items[1]},
		"/apis/discovery.k8s.io/v1/endpointslices": {&slices.Items[0]},
		"/api/v1/namespaces":                       {&namespaces.Items[0], &namespaces.Items[1]},
		"/api/v1/pods":                             nil,
	}
	bookmarks := map[string]any{
		"/api/v1/services":                         &corev1.Service{TypeMeta: services.Items[0].TypeMeta},
		"/apis/discovery.k8s.io/v1/endpointslices": &discoveryv1.EndpointSlice{TypeMeta: slices.Items[0].TypeMeta},
		"/api/v1/namespaces":                       &corev1.Namespace{TypeMeta: namespaces.Items[0].TypeMeta},
		"/api/v1/pods":                             &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}},
	}

	a := &fakeAPIServer{requests: map[string]int{}}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" { // compactcache's probe of the connection
			a.mu.Lock()
			a.requests["/readyz"]++
			a.mu.Unlock()
			io.WriteString(w, "ok")
			return
		}
		list, ok := lists[r.URL.Path]
		if !ok {
			a.mu.Lock()
			a.unknown = append(a.unknown, r.Method+" "+r.URL.String())
			a.mu.Unlock()
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		kind := "list"
		if q.Get("watch") == "true" || q.Get("watch") == "1" {
			kind = "watch"
		}
		a.mu.Lock()
		a.requests[r.URL.Path+" "+kind]++
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if kind == "list" {
			encjson.NewEncoder(w).Encode(list)
			return
		}
		w.Header().Set("Transfer-Encoding", "chunked")
		w.WriteHeader(http.StatusOK)
		enc := encjson.NewEncoder(w)
		if q.Get("sendInitialEvents") == "true" {
			for _, it := range items[r.URL.Path] {
				enc.Encode(map[string]any{"type": "ADDED", "object": it})
			}
			bm := bookmarks[r.URL.Path]
			raw, _ := encjson.Marshal(bm)
			var obj map[string]any
			encjson.Unmarshal(raw, &obj)
			obj["metadata"] = map[string]any{"resourceVersion": "1", "annotations": map[string]string{metav1.InitialEventsAnnotationKey: "true"}}
			enc.Encode(map[string]any{"type": "BOOKMARK", "object": obj})
		}
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *fakeAPIServer) served(path string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.requests[path+" list"] + a.requests[path+" watch"]
}

func ptr[T any](v T) *T { return &v }

func service(ns, name, ip string, p corev1.ServicePort) corev1.Service {
	return corev1.Service{
		TypeMeta:   metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, ResourceVersion: "1"},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip}, Ports: []corev1.ServicePort{p}},
	}
}

func namespace(name string) corev1.Namespace {
	return corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{Kind: "Namespace", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"},
	}
}

// rewrite is where the test moves a Corefile's listeners and upstreams.
type rewrite struct {
	dnsPort     int // the server blocks' own port
	frontPort   int // the front end's, where clients ask
	healthAddr  string
	readyAddr   string
	metricsAddr string
	apiServer   string // "" when the Corefile has no kubernetes block
	kubeconfig  string // in place of apiServer: a real API server's
	adminAddr   string // the admin endpoint's
	tokenFile   string // the admin and warm-up token's
	upstream    string
	snapshotDir string // where snapshot files go
}

// rewriteCorefile applies r to corefile line by line and returns the result
// and the list of lines it changed.
func rewriteCorefile(t testing.TB, corefile string, r rewrite) (string, []string) {
	t.Helper()
	var out, changes []string
	serverKey := regexp.MustCompile(`:1053\b`)
	depth := 0 // of the line's directive: 1 in a server block, 2 in a directive's block
	for _, line := range strings.Split(corefile, "\n") {
		orig := line
		trimmed := strings.TrimSpace(line)
		indent := line[:len(line)-len(strings.TrimLeft(line, " \t"))]
		fields := strings.Fields(trimmed)
		first := ""
		if len(fields) > 0 {
			first = fields[0]
		}
		var extra []string
		switch {
		case indent == "" && strings.HasSuffix(trimmed, "{"):
			// A server block's keys: listen on the test's port, on 127.0.0.1.
			line = serverKey.ReplaceAllString(line, ":"+strconv.Itoa(r.dnsPort))
			if !strings.Contains(corefile, "bind ") {
				extra = append(extra, "    bind 127.0.0.1")
			}
		case first == "bind":
			line = indent + "bind 127.0.0.1"
		case first == "snapshot" && len(fields) >= 2:
			line = indent + "snapshot " + filepath.Join(r.snapshotDir, filepath.Base(fields[1])) + " " + strings.Join(fields[2:], " ")
			line = strings.TrimRight(line, " ")
		case first == "frontend":
			line = indent + "frontend 127.0.0.1:" + strconv.Itoa(r.frontPort) + blockOpen(fields)
		case first == "health":
			line = indent + "health " + r.healthAddr + blockOpen(fields)
		case first == "ready":
			line = indent + "ready " + r.readyAddr + blockOpen(fields)
		case first == "prometheus":
			line = indent + "prometheus " + r.metricsAddr + blockOpen(fields)
		case first == "forward" && len(fields) >= 3 && fields[2] == "/etc/resolv.conf":
			line = indent + "forward " + fields[1] + " " + r.upstream + blockOpen(fields)
		case first == "admin":
			line = indent + "admin " + r.adminAddr + blockOpen(fields)
		case first == "token_file":
			line = indent + "token_file " + r.tokenFile
		case first == "kubernetes" && depth == 1: // not compactcache's option
			if !strings.HasSuffix(trimmed, "{") {
				t.Fatalf("the kubernetes directive has no block to add an endpoint to: %q", line)
			}
			if r.kubeconfig != "" {
				extra = append(extra, indent+"    kubeconfig "+r.kubeconfig+" test")
			} else {
				extra = append(extra, indent+"    endpoint "+r.apiServer)
			}
		}
		if strings.HasSuffix(trimmed, "{") {
			depth++
		}
		if trimmed == "}" {
			depth--
		}
		out = append(out, line)
		out = append(out, extra...)
		if line != orig {
			changes = append(changes, fmt.Sprintf("%q -> %q", orig, line))
		}
		for _, e := range extra {
			changes = append(changes, fmt.Sprintf("+ %q", e))
		}
	}
	return strings.Join(out, "\n"), changes
}

func blockOpen(fields []string) string {
	if len(fields) > 0 && fields[len(fields)-1] == "{" {
		return " {"
	}
	return ""
}

// instance is a process a test runs: coredns, or a server of the control
// plane.
type instance struct {
	name   string
	cmd    *exec.Cmd
	out    *testenv.LogBuffer
	exited chan struct{} // closed when it exits
	err    error         // how it exited, once exited is closed
}

// start runs coredns on corefile, with env added to the test's.
func start(t testing.TB, bin, corefile string, env ...string) *instance {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-conf", path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	return run(t, "coredns", 0, cmd)
}

// run starts cmd, its output kept for the log of a failed test (its last
// keep bytes; 0: all of it), and kills it at the end of the test.
func run(t testing.TB, name string, keep int, cmd *exec.Cmd) *instance {
	t.Helper()
	in := &instance{name: name, cmd: cmd, out: &testenv.LogBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = in.out, in.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() { in.err = cmd.Wait(); close(in.exited) }()
	t.Cleanup(func() {
		select {
		case <-in.exited:
		default:
			cmd.Process.Kill()
			<-in.exited
		}
		if t.Failed() {
			s := in.out.String()
			if keep > 0 && len(s) > keep {
				s = "…" + s[len(s)-keep:]
			}
			t.Logf("%s output:\n%s", name, s)
		}
	})
	return in
}

// stop sends SIGTERM, as the kubelet does, and waits for a clean exit.
func (in *instance) stop(t testing.TB, within time.Duration) time.Duration {
	t.Helper()
	begin := time.Now()
	in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-in.exited:
		if in.err != nil {
			t.Errorf("%s exited with %v after SIGTERM", in.name, in.err)
		}
	case <-time.After(within):
		t.Errorf("%s still running %v after SIGTERM", in.name, within)
	}
	return time.Since(begin)
}

// waitOutput waits for coredns to print want, as it prints its version once
// every server listens.
func waitOutput(t testing.TB, in *instance, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if strings.Contains(in.out.String(), want) {
			return
		}
		select {
		case <-in.exited:
			t.Fatalf("%s exited (%v) before printing %q", in.name, in.err, want)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("%s did not print %q within %v", in.name, want, within)
}

// waitHTTP polls url until it answers 200 or the time is up.
func waitHTTP(t testing.TB, in *instance, url string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	last := ""
	for time.Now().Before(deadline) {
		select {
		case <-in.exited:
			t.Fatalf("%s exited (%v) before %s answered", in.name, in.err, url)
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s did not answer 200 within %v; last: %s", url, within, last)
}

func query(t testing.TB, server, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, false)
	r, _, err := c.Exchange(m, server)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	return r
}

func wantA(t testing.TB, r *dns.Msg, ip string, maxTTL uint32) {
	t.Helper()
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok && a.A.String() == ip {
			if a.Hdr.Ttl > maxTTL {
				t.Errorf("%s: TTL %d above %d", a.Hdr.Name, a.Hdr.Ttl, maxTTL)
			}
			return
		}
	}
	t.Errorf("no A %s in\n%v", ip, r)
}

// scrape returns the metrics page as lines of sample name, labels, value.
func scrape(t testing.TB, url string) map[string][]sample {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string][]sample{}
	line := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)`)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			v, _ := strconv.ParseFloat(m[3], 64)
			out[m[1]] = append(out[m[1]], sample{labels: m[2], value: v})
		}
	}
	return out
}

type sample struct {
	labels string
	value  float64
}

func sum(samples []sample) float64 {
	var s float64
	for _, x := range samples {
		s += x.value
	}
	return s
}

// configMapCorefile returns the Corefile of the ConfigMap a workload mounts.
func configMapCorefile(t testing.TB, file, name string) string {
	t.Helper()
	ms := decodeStrict(t, filepath.Join("kubernetes", file))
	return object[*corev1.ConfigMap](t, ms, name).Data["Corefile"]
}

func TestClusterCorefileStarts(t *testing.T) {
	bin := corednsBinary(t)
	api := startAPIServer(t)
	up := startUpstream(t)
	r := rewrite{
		dnsPort:     testenv.FreePort(t),
		frontPort:   testenv.FreePort(t),
		healthAddr:  fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		readyAddr:   fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		metricsAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		apiServer:   api.URL,
		upstream:    up.addr,
		adminAddr:   fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		tokenFile:   filepath.Join(t.TempDir(), "token"),
	}
	if err := os.WriteFile(r.tokenFile, []byte("compactcache-test-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	original := configMapCorefile(t, "coredns.yaml", "coredns-compactcache")
	cf, changes := rewriteCorefile(t, original, r)
	t.Logf("changed for the test:\n  %s", strings.Join(changes, "\n  "))
	if len(changes) != 11 {
		t.Errorf("%d changes, want 11: listen port, bind, health, ready, prometheus, forward, endpoint, front end, admin, admin's and warmup's token_file", len(changes))
	}

	begin := time.Now()
	// The first pod of a Deployment: the peers' Service has no pod behind
	// it, so the warm-up finds nothing listening and the pod starts cold.
	in := start(t, bin, cf, "COREDNS_PEERS_SERVICE_HOST=127.0.0.1", fmt.Sprintf("COREDNS_PEERS_SERVICE_PORT=%d", testenv.FreePort(t)))
	// The servers listen once the kubernetes plugin has synced, or given up
	// after its startup_timeout (5s); /ready answers 200 only when it has
	// synced its services, endpointslices and namespaces from the API server.
	waitOutput(t, in, "CoreDNS-", 30*time.Second)
	t.Logf("listening after %v", time.Since(begin).Round(10*time.Millisecond))
	waitHTTP(t, in, "http://"+r.readyAddr+"/ready", 10*time.Second)
	t.Logf("ready after %v", time.Since(begin).Round(10*time.Millisecond))
	if strings.Contains(in.out.String(), "starting server with unsynced Kubernetes API") {
		t.Error("the kubernetes plugin did not sync with the fake API server before its startup timeout")
	}
	waitHTTP(t, in, "http://"+r.healthAddr+"/health", 5*time.Second)
	if !strings.Contains(in.out.String(), "Warm-up of dns://.:") || !strings.Contains(in.out.String(), "starting cold") {
		t.Error("no log line of a warm-up given up for want of a peer")
	}
	for _, p := range []string{"/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices", "/api/v1/namespaces"} {
		if api.served(p) == 0 {
			t.Errorf("the kubernetes plugin never asked for %s", p)
		}
	}

	// Clients ask the front end, as the Service sends them to port 53.
	server := fmt.Sprintf("127.0.0.1:%d", r.frontPort)
	// A cluster name, from the kubernetes plugin, twice: a miss then a hit.
	for i, network := range []string{"udp", "tcp", "udp"} {
		resp := query(t, server, network, "kubernetes.default.svc.cluster.local", dns.TypeA)
		if resp.Rcode != dns.RcodeSuccess {
			t.Fatalf("query %d: rcode %s", i, dns.RcodeToString[resp.Rcode])
		}
		wantA(t, resp, "10.96.0.1", 30)
	}
	// Reverse of a service address, from the kubernetes plugin.
	ptr := query(t, server, "udp", "1.0.96.10.in-addr.arpa", dns.TypePTR)
	if len(ptr.Answer) != 1 || ptr.Answer[0].(*dns.PTR).Ptr != "kubernetes.default.svc.cluster.local." {
		t.Errorf("PTR 10.96.0.1: %v", ptr)
	}
	// Reverse of an address the cluster does not know falls through to forward.
	query(t, server, "udp", "9.2.0.192.in-addr.arpa", dns.TypePTR)
	if up.count("9.2.0.192.in-addr.arpa.", dns.TypePTR) != 1 {
		t.Error("fallthrough in-addr.arpa did not reach forward")
	}
	// An outside name goes to forward once, then comes from the cache.
	for range 3 {
		wantA(t, query(t, server, "udp", "www.example.org", dns.TypeA), "192.0.2.53", 30)
	}
	if n := up.count("www.example.org.", dns.TypeA); n != 1 {
		t.Errorf("the upstream saw www.example.org %d times, want 1 (then hits)", n)
	}

	t.Logf("queries done after %v", time.Since(begin).Round(10*time.Millisecond))
	m := scrape(t, "http://"+r.metricsAddr+"/metrics")
	if got := sum(m["coredns_compactcache_capacity_bytes"]); got != 64*mib {
		t.Errorf("coredns_compactcache_capacity_bytes %v, want 64MiB", got)
	}
	if got := sum(m["coredns_cache_hits_total"]); got < 3 {
		t.Errorf("coredns_cache_hits_total %v, want at least 3", got)
	}
	if got := sum(m["coredns_cache_entries"]); got < 3 {
		t.Errorf("coredns_cache_entries %v, want at least 3", got)
	}
	checkFrontend(t, "http://"+r.metricsAddr+"/metrics", 3)
	// Every metric the dashboard and the alerts name is on the page, but
	// the shared tier's: it is off in this Corefile (shared-tier.yaml is
	// optional), and TestMonitoringNamesExportedMetrics sees them exported;
	// and the admin endpoint's, which have series once it is asked (by a
	// peer's warm-up, or compactcache-ctl), as TestProcessPanelsExported
	// asks it.
	for _, name := range monitoredMetrics(t) {
		if _, ok := m[name]; !ok && !strings.HasPrefix(name, "coredns_compactcache_shared_") && !strings.HasPrefix(name, "coredns_compactcache_admin_") {
			t.Errorf("%s is named by the dashboard or alerts but not exported by the binary", name)
		}
	}
	api.mu.Lock()
	t.Logf("API requests served: %v; not served: %v", api.requests, api.unknown)
	api.mu.Unlock()

	took := in.stop(t, 20*time.Second)
	t.Logf("stopped %v after SIGTERM (health lameduck 5s)", took.Round(100*time.Millisecond))
}

func TestNodeLocalCorefileStarts(t *testing.T) {
	bin := corednsBinary(t)
	up := startUpstream(t)
	r := rewrite{
		dnsPort:     testenv.FreePort(t),
		frontPort:   testenv.FreePort(t),
		healthAddr:  fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		metricsAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		upstream:    up.addr,
		snapshotDir: t.TempDir(),
	}
	original := configMapCorefile(t, "nodelocaldns.yaml", "node-local-dns")
	cf, changes := rewriteCorefile(t, original, r)
	t.Logf("changed for the test:\n  %s", strings.Join(changes, "\n  "))

	// What Kubernetes puts in the pod's environment for kube-dns-upstream,
	// with the fake upstream's port.
	in := start(t, bin, cf, "KUBE_DNS_UPSTREAM_SERVICE_HOST="+up.addr)
	waitOutput(t, in, "CoreDNS-", 30*time.Second)
	waitHTTP(t, in, "http://"+r.healthAddr+"/health", 30*time.Second)

	// Clients ask the front end on 169.254.20.10:53, which the three blocks
	// share, each answering its zones' hits from its own cache.
	server := fmt.Sprintf("127.0.0.1:%d", r.frontPort)
	for range 2 {
		wantA(t, query(t, server, "udp", "kubernetes.default.svc.cluster.local", dns.TypeA), "192.0.2.53", 30)
		wantA(t, query(t, server, "udp", "www.example.org", dns.TypeA), "192.0.2.53", 30)
		if r := query(t, server, "udp", "9.2.0.192.in-addr.arpa", dns.TypePTR); r.Rcode != dns.RcodeNameError {
			t.Errorf("PTR: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
		}
	}
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"kubernetes.default.svc.cluster.local.", dns.TypeA}, {"www.example.org.", dns.TypeA}, {"9.2.0.192.in-addr.arpa.", dns.TypePTR}} {
		if n := up.count(q.name, q.qtype); n != 1 {
			t.Errorf("the upstream saw %s %d times, want 1 (then a hit)", q.name, n)
		}
	}

	checkFrontend(t, "http://"+r.metricsAddr+"/metrics", 3)
	m := scrape(t, "http://"+r.metricsAddr+"/metrics")
	var caps []float64
	for _, s := range m["coredns_compactcache_capacity_bytes"] {
		caps = append(caps, s.value/mib)
	}
	if got := sum(m["coredns_compactcache_capacity_bytes"]); got != 64*mib {
		t.Errorf("capacities %v MiB, want 16 + 8 + 40", caps)
	}
	if got := sum(m["coredns_cache_hits_total"]); got < 3 {
		t.Errorf("coredns_cache_hits_total %v, want at least 3", got)
	}
	// Each block's hit was the front end's, counted for its own zones.
	for _, zones := range []string{"cluster.local.", "in-addr.arpa.,ip6.arpa.", "."} {
		n := 0.0
		for _, s := range m["coredns_compactcache_frontend_requests_total"] {
			if strings.Contains(s.labels, `result="hit"`) && strings.Contains(s.labels, `zones="`+zones+`"`) {
				n += s.value
			}
		}
		if n != 1 {
			t.Errorf("the front end answered %v hits of the block of %s, want 1", n, zones)
		}
	}
	in.stop(t, 20*time.Second)
	// SIGTERM is the final shutdown: each block wrote its snapshot.
	for _, f := range []string{"cluster.local.snap", "arpa.snap", "root.snap"} {
		if fi, err := os.Stat(filepath.Join(r.snapshotDir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("no snapshot %s after the shutdown: %v", f, err)
		}
	}
}

// checkFrontend fails unless the front end answered at least hits hits
// itself and handed the misses to the chain, and the prometheus plugin
// counted both in its per-request series. Both count a front-end hit once
// its reply is sent, after the client may have it: the metrics at url are
// scraped again until they do, for at most two seconds.
func checkFrontend(t testing.TB, url string, hits float64) {
	t.Helper()
	var hit, chain, requests float64
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m := scrape(t, url)
		by := func(result string) (n float64) {
			for _, s := range m["coredns_compactcache_frontend_requests_total"] {
				if strings.Contains(s.labels, `result="`+result+`"`) {
					n += s.value
				}
			}
			return n
		}
		hit, chain, requests = by("hit"), by("chain"), sum(m["coredns_dns_requests_total"])
		if hit >= hits && requests >= hit+chain || time.Now().After(deadline) {
			break
		}
	}
	if hit < hits || chain < 1 {
		t.Errorf("the front end answered %v hits and handed %v requests to the chain; want at least %v and 1", hit, chain, hits)
	}
	if requests < hit+chain {
		t.Errorf("coredns_dns_requests_total %v, below the %v requests the front end read", requests, hit+chain)
	}
}

func TestRewriteCorefile(t *testing.T) {
	in := ".:1053 {\n    health {\n        lameduck 5s\n    }\n    ready\n    kubernetes cluster.local {\n        ttl 30\n    }\n    prometheus :9153\n    forward . /etc/resolv.conf {\n        max_concurrent 1000\n    }\n    compactcache 30 {\n        kubernetes\n        frontend :53 {\n            inflight 1024\n        }\n    }\n}\n"
	out, changes := rewriteCorefile(t, in, rewrite{dnsPort: 2053, frontPort: 2054, healthAddr: "127.0.0.1:1", readyAddr: "127.0.0.1:2", metricsAddr: "127.0.0.1:3", apiServer: "http://127.0.0.1:4", upstream: "127.0.0.1:5"})
	want := ".:2053 {\n    bind 127.0.0.1\n    health 127.0.0.1:1 {\n        lameduck 5s\n    }\n    ready 127.0.0.1:2\n    kubernetes cluster.local {\n        endpoint http://127.0.0.1:4\n        ttl 30\n    }\n    prometheus 127.0.0.1:3\n    forward . 127.0.0.1:5 {\n        max_concurrent 1000\n    }\n    compactcache 30 {\n        kubernetes\n        frontend 127.0.0.1:2054 {\n            inflight 1024\n        }\n    }\n}\n"
	if out != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	if len(changes) != 8 {
		t.Errorf("%d changes: %q", len(changes), changes)
	}
}
