package deploy

import (
	encjson "encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"

	"github.com/miekg/dns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRealAPIServer applies the manifests to a real API server and runs
// their Corefiles against it, each beside the same Corefile with the stock
// cache in place of compactcache, asking both the same questions at the
// same moments and listing where their answers differ.
//
// The kubernetes plugin authenticates as the manifests' ServiceAccount,
// with a token the API server issues, so the ClusterRole is what lets it
// list and watch. Only the listeners, the upstream and the token's path
// move (rewriteCorefile); the Corefiles are read back from the API server.
func TestRealAPIServer(t *testing.T) {
	cp := startControlPlane(t)
	bin := corednsBinary(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("compactcache-test-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	applyManifests(t, cp, tokenFile)
	cp.kubectl(t, dnsTestObjects(false), "apply", "-f", "-")
	var webIPs []string
	if err := encjson.Unmarshal([]byte(cp.kubectl(t, "", "-n", "dnstest", "get", "service", "web", "-o", "jsonpath={.spec.clusterIPs}")), &webIPs); err != nil || len(webIPs) != 2 {
		t.Fatalf("web's clusterIPs %v (%v), want an IPv4 and an IPv6 address", webIPs, err)
	}
	t.Logf("Service web: %v", webIPs)

	kubeconfig := cp.serviceAccountKubeconfig(t, "kube-system", "coredns")
	clusterCF := cp.kubectl(t, "", "-n", "kube-system", "get", "configmap", "coredns-compactcache", "-o", "jsonpath={.data.Corefile}")
	if clusterCF != configMapCorefile(t, "coredns.yaml", "coredns-compactcache") {
		t.Error("the Corefile the API server stored differs from the manifest's")
	}
	ours := startClusterDNS(t, bin, clusterCF, kubeconfig, tokenFile, "", 0)
	stock := startClusterDNS(t, bin, stockCorefile(clusterCF), kubeconfig, tokenFile, "", 0)
	servers := []*dnsServer{ours, stock}
	var diffs differences

	cluster := func(name string) string { return name + ".dnstest.svc.cluster.local." }
	probes := []probe{
		{cluster("web"), dns.TypeA}, {cluster("web"), dns.TypeAAAA}, {"_http._tcp." + cluster("web"), dns.TypeSRV},
		{cluster("db"), dns.TypeA}, {"_pg._tcp." + cluster("db"), dns.TypeSRV},
		{cluster("ext"), dns.TypeA},
		{cluster("nope"), dns.TypeA},
		{cluster("api"), dns.TypeA}, {"1.100.96.10.in-addr.arpa.", dns.TypePTR}, {"2.100.96.10.in-addr.arpa.", dns.TypePTR},
	}
	// What the kubernetes plugin answers for the objects of dnsTestObjects.
	want := map[probe][]string{
		probes[0]: {"NOERROR", cluster("web") + " A " + webIPs[0]},
		probes[1]: {"NOERROR", cluster("web") + " AAAA " + webIPs[1]},
		// One SRV record per address family, the same but for the weight,
		// which the kubernetes plugin shares out before it drops duplicates.
		probes[2]: {"NOERROR", "_http._tcp." + cluster("web") + " SRV 0 50 80 " + cluster("web")},
		probes[3]: {"NOERROR", cluster("db") + " A 10.1.0.1", cluster("db") + " A 10.1.0.2"},
		probes[4]: {"NOERROR", "_pg._tcp." + cluster("db") + " SRV 0 50 5432 10-1-0-2." + cluster("db"), "_pg._tcp." + cluster("db") + " SRV 0 50 5432 db-0." + cluster("db")},
		probes[5]: {"NOERROR", cluster("ext") + " CNAME www.example.org.", "www.example.org. A 192.0.2.53"},
		probes[6]: {"NXDOMAIN"},
		probes[7]: {"NOERROR", cluster("api") + " A 10.96.100.1"},
		probes[8]: {"NOERROR", "1.100.96.10.in-addr.arpa. PTR " + cluster("api")},
		// An address no Service has falls through to forward.
		probes[9]: {"NXDOMAIN"},
	}

	// 1. A miss, then a hit: the same answer, the TTL counted down from
	// the kubernetes plugin's 30 s, and the cache's hit counters moving.
	first := map[*dnsServer]map[probe]answer{}
	for _, s := range servers {
		first[s] = map[probe]answer{}
		for _, p := range probes {
			a := s.ask(t, p)
			first[s][p] = a
			if !slices.Equal(a.lines, want[p]) {
				t.Errorf("%s %s: %v, want %v", s.name, p, a.lines, want[p])
			}
			if a.ttl > 30 || a.ttl < 28 {
				t.Errorf("%s %s: TTL %d on the first ask, want 30 (the kubernetes plugin's ttl)", s.name, p, a.ttl)
			}
		}
	}
	if up := ours.upstream.count("www.example.org.", dns.TypeA); up != 1 {
		t.Errorf("ext's CNAME target reached the upstream %d times, want 1 (the kubernetes plugin's nested lookup)", up)
	}
	time.Sleep(1100 * time.Millisecond) // a second passes: a hit's TTL is one less
	second := map[*dnsServer]map[probe]answer{}
	for _, s := range servers {
		hits := s.hits(t)
		second[s] = map[probe]answer{}
		for _, p := range probes {
			a := s.ask(t, p)
			second[s][p] = a
			if !slices.Equal(a.lines, first[s][p].lines) {
				t.Errorf("%s %s: the second ask answered %v, the first %v", s.name, p, a.lines, first[s][p].lines)
			}
			if a.ttl >= first[s][p].ttl {
				t.Errorf("%s %s: TTL %d on the second ask, %d on the first: not counted down", s.name, p, a.ttl, first[s][p].ttl)
			}
		}
		if got := s.hits(t) - hits; got != float64(len(probes)) {
			t.Errorf("%s: coredns_cache_hits_total rose by %v over the %d second asks, want %d", s.name, got, len(probes), len(probes))
		}
		t.Logf("%s: the second asks were %d hits", s.name, len(probes))
	}
	if up := ours.upstream.count("www.example.org.", dns.TypeA); up != 1 {
		t.Errorf("ext's CNAME target reached the upstream %d times after its hit, want 1", up)
	}
	diffs.compare("first ask", probes, first[ours], first[stock])
	diffs.compare("second ask", probes, second[ours], second[stock])

	// 2. A peer warms a new pod: a second process with the same Corefile,
	// its warmup pointed where COREDNS_PEERS_SERVICE_HOST and _PORT point
	// in a pod, at the first one's admin endpoint.
	warm := startClusterDNS(t, bin, clusterCF, kubeconfig, tokenFile, ours.adminAddr, ours.rw.dnsPort)
	if !strings.Contains(warm.in.out.String(), "Warm-up of dns://.:") || strings.Contains(warm.in.out.String(), "starting cold") {
		t.Errorf("the new process did not fill from its peer:\n%s", warm.in.out.String())
	}
	for _, l := range strings.Split(warm.in.out.String(), "\n") {
		if strings.Contains(l, "Warm-up of") {
			t.Logf("the new process: %s", strings.TrimSpace(l))
		}
	}
	hits := warm.hits(t)
	if a := warm.ask(t, probes[5]); !slices.Equal(a.lines, want[probes[5]]) {
		t.Errorf("warmed %s: %v, want %v", probes[5], a.lines, want[probes[5]])
	}
	if got := warm.hits(t) - hits; got != 1 || warm.upstream.count("www.example.org.", dns.TypeA) != 0 {
		t.Errorf("warmed process: its first ask of %s was not a hit (hits +%v, upstream asked %d times)", probes[5], got, warm.upstream.count("www.example.org.", dns.TypeA))
	}
	warm.in.stop(t, 20*time.Second)

	// 3. The cluster changes: web deleted, db's EndpointSlice changed, a
	// Service where the name did not exist, ext's target changed, api
	// deleted and created again with another ClusterIP; all while clients
	// ask (load). compactcache follows the kubernetes plugin's informers
	// (its kubernetes option): its answers are new within a second; the
	// stock cache's when their TTL runs out.
	stopLoad := queryLoad(t, servers, probes)
	began := time.Now()
	cp.kubectl(t, "", "-n", "dnstest", "delete", "service", "web", "api")
	cp.kubectl(t, dnsTestObjects(true), "apply", "-f", "-")
	changed := time.Now()
	t.Logf("the change: kubectl delete and apply took %.1fs; the times below are from their end", changed.Sub(began).Seconds())
	after := map[probe][]string{
		probes[0]: {"NXDOMAIN"}, probes[1]: {"NXDOMAIN"}, probes[2]: {"NXDOMAIN"},
		probes[3]: {"NOERROR", cluster("db") + " A 10.1.0.1", cluster("db") + " A 10.1.0.3"},
		probes[4]: {"NOERROR", "_pg._tcp." + cluster("db") + " SRV 0 50 5432 10-1-0-3." + cluster("db"), "_pg._tcp." + cluster("db") + " SRV 0 50 5432 db-0." + cluster("db")},
		probes[5]: {"NOERROR", cluster("ext") + " CNAME www.example.net.", "www.example.net. A 192.0.2.53"},
		probes[7]: {"NOERROR", cluster("api") + " A 10.96.100.2"},
		probes[8]: {"NXDOMAIN"},
		probes[9]: {"NOERROR", "2.100.96.10.in-addr.arpa. PTR " + cluster("api")},
	}
	// Between api's deletion and its creation: no api.
	between := map[probe][]string{probes[7]: {"NXDOMAIN"}}
	after[probes[6]] = []string{"NOERROR", cluster("nope") + " A 10.96.100.3"}
	// What a client sees meanwhile: with the stock cache, the cached
	// answer, its TTL counting down from what the second ask showed, until
	// it runs out; with compactcache, the new one within a second; then
	// never the old one again. Asked ten times a second.
	switched := map[*dnsServer]map[probe]time.Duration{}
	stale := map[*dnsServer]map[probe][]uint32{} // the old answer's TTLs seen after the change
	for _, s := range servers {
		switched[s] = map[probe]time.Duration{}
		stale[s] = map[probe][]uint32{}
	}
	deadline := changed.Add(40 * time.Second)
	for len(switched[ours])+len(switched[stock]) < 2*len(probes) && time.Now().Before(deadline) {
		for _, s := range servers {
			for _, p := range probes {
				a := s.ask(t, p)
				since := a.at.Sub(changed)
				old := second[s][p]
				left := time.Duration(old.ttl)*time.Second - a.at.Sub(old.at) // what the cached entry has left
				_, done := switched[s][p]
				switch {
				case slices.Equal(a.lines, old.lines) && !done:
					stale[s][p] = append(stale[s][p], a.ttl)
					if left < -1500*time.Millisecond {
						t.Errorf("%s %s: the old answer %v served %v after its TTL ran out", s.name, p, a.lines, -left)
					}
					if d := time.Duration(a.ttl)*time.Second - left; d > 1500*time.Millisecond || d < -1500*time.Millisecond {
						t.Errorf("%s %s: the old answer with TTL %d, %v left of its entry", s.name, p, a.ttl, left.Round(100*time.Millisecond))
					}
				case slices.Equal(a.lines, after[p]):
					if !done {
						switched[s][p] = since
						if s == stock && left > 1500*time.Millisecond {
							t.Errorf("%s %s: the new answer %v with %v left of the cached one's TTL", s.name, p, a.lines, left.Round(100*time.Millisecond))
						}
						if s == ours && since > time.Second {
							t.Errorf("%s %s: the new answer %v %v after the change, want within 1s", s.name, p, a.lines, since.Round(10*time.Millisecond))
						}
					}
				case slices.Equal(a.lines, between[p]) && !done:
				default:
					t.Errorf("%s %s, %v after the change: %v; neither the old %v nor the new %v", s.name, p, since.Round(100*time.Millisecond), a.lines, old.lines, after[p])
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopLoad()
	for _, p := range probes {
		for _, s := range servers {
			d, ok := switched[s][p]
			if !ok {
				t.Errorf("%s %s: still the old answer 40 s after the change", s.name, p)
				continue
			}
			seen := stale[s][p]
			if len(seen) == 0 {
				if s == stock {
					t.Errorf("%s %s: the old answer never seen after the change", s.name, p)
					continue
				}
				t.Logf("%-12s %-45s the old answer %3d times,                 then the new one %4.1fs after the change", s.name, p, 0, d.Seconds())
				continue
			}
			t.Logf("%-12s %-45s the old answer %3d times, TTL %2d down to %2d, then the new one %4.1fs after the change", s.name, p, len(seen), seen[0], seen[len(seen)-1], d.Seconds())
		}
		if d := switched[ours][p] - switched[stock][p]; d > 1500*time.Millisecond || d < -1500*time.Millisecond {
			diffs.add(fmt.Sprintf("after the change, %s: the new answer %.1fs after it with compactcache, %.1fs with cache", p, switched[ours][p].Seconds(), switched[stock][p].Seconds()))
		}
	}
	// Each answer is now new; a second ask of it is a hit with the same.
	third := map[*dnsServer]map[probe]answer{}
	for _, s := range servers {
		third[s] = map[probe]answer{}
		for _, p := range probes {
			third[s][p] = s.ask(t, p)
		}
	}
	diffs.compare("after the change", probes, third[ours], third[stock])

	// 4. NXDOMAIN under cluster.local is cached for the denial TTL: the
	// SOA's TTL counts down from 30 (the kubernetes plugin's ttl, which
	// compactcache 30 caps too). With the stock cache a name created
	// meanwhile stays NXDOMAIN until it runs out; compactcache drops it
	// when the name's Service comes, as the change above showed for nope.
	gone := probe{cluster("gone"), dns.TypeA}
	negFirst := map[*dnsServer]answer{}
	for _, s := range servers {
		a := s.ask(t, gone)
		negFirst[s] = a
		if a.lines[0] != "NXDOMAIN" || a.ttl > 30 || a.ttl < 28 {
			t.Errorf("%s %s: %v TTL %d, want NXDOMAIN with the SOA's TTL 30", s.name, gone, a.lines, a.ttl)
		}
	}
	time.Sleep(1100 * time.Millisecond)
	for _, s := range servers {
		hits := s.hits(t)
		a := s.ask(t, gone)
		if a.lines[0] != "NXDOMAIN" || a.ttl >= negFirst[s].ttl || s.hits(t)-hits != 1 {
			t.Errorf("%s %s: the second ask %v TTL %d (first %d), hits +%v: want a cached NXDOMAIN counting down", s.name, gone, a.lines, a.ttl, negFirst[s].ttl, s.hits(t)-hits)
		}
	}
	t.Log("autopath: the manifests' Corefiles do not use it; nothing to check")

	// 5. The node-local Corefile, forwarding the cluster zones to a cluster
	// DNS process as it forwards to kube-dns-upstream in a cluster: the
	// same answers, success TTLs within 30 s and denials within 5 s.
	localCF := cp.kubectl(t, "", "-n", "kube-system", "get", "configmap", "node-local-dns", "-o", "jsonpath={.data.Corefile}")
	local := startNodeLocal(t, bin, localCF, ours.addr)
	localStock := startNodeLocal(t, bin, stockCorefile(localCF), stock.addr)
	localFirst := map[*dnsServer]map[probe]answer{}
	for _, pair := range [][2]*dnsServer{{local, ours}, {localStock, stock}} {
		s, upstream := pair[0], pair[1]
		localFirst[s] = map[probe]answer{}
		for _, p := range append(slices.Clone(probes), gone) {
			a := s.ask(t, p)
			localFirst[s][p] = a
			if u := upstream.ask(t, p); !slices.Equal(a.lines, u.lines) {
				t.Errorf("%s %s: %v, the cluster DNS under it %v", s.name, p, a.lines, u.lines)
			}
			// Denials are cached for 5 s in the cluster.local block, 30 in
			// the reverse zones'.
			denial := a.lines[0] == "NXDOMAIN" && strings.HasSuffix(p.name, ".cluster.local.")
			if limit := map[bool]uint32{true: 5, false: 30}[denial]; a.ttl > limit {
				t.Errorf("%s %s: TTL %d above %d", s.name, p, a.ttl, limit)
			}
		}
		hits := s.hits(t)
		for _, p := range probes {
			s.ask(t, p)
		}
		if got := s.hits(t) - hits; got != float64(len(probes)) {
			t.Errorf("%s: hits rose by %v over %d second asks", s.name, got, len(probes))
		}
	}
	diffs.compare("node-local", append(slices.Clone(probes), gone), localFirst[local], localFirst[localStock])

	// 6. The API server lost: compactcache says so, in a log line and a
	// gauge, within its probe's period; its entries keep their TTL.
	cp.apiserver.cmd.Process.Kill()
	<-cp.apiserver.exited
	lost := time.Now()
	for !strings.Contains(ours.in.out.String(), "no longer learn of the cluster's changes") && time.Since(lost) < 30*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	if got := sum(scrape(t, ours.metrics)["coredns_compactcache_kubernetes_connected"]); got != 0 || !strings.Contains(ours.in.out.String(), "no longer learn of the cluster's changes") {
		t.Errorf("the API server killed: coredns_compactcache_kubernetes_connected %v and no log line 30s later, want 0 and one", got)
	} else {
		t.Logf("the API server killed: compactcache said so %.1fs later", time.Since(lost).Seconds())
	}

	if len(diffs) == 0 {
		t.Log("differences from the stock cache: none")
	} else {
		t.Logf("differences from the stock cache:\n  %s", strings.Join(diffs, "\n  "))
	}
	for _, s := range []*dnsServer{local, localStock, ours, stock} {
		s.in.stop(t, 20*time.Second)
	}
}

// applyManifests applies deploy/kubernetes/*.yaml, placeholders filled in,
// first with --dry-run=server (the API server's validation and defaulting,
// nothing stored), then for real, and checks every object is stored.
func applyManifests(t testing.TB, cp *controlPlane, tokenFile string) {
	t.Helper()
	fill := strings.NewReplacer("COREDNS_IMAGE", "registry.invalid/coredns-compactcache:test",
		"NODE_SETUP_IMAGE", "registry.invalid/node-setup:test", "CLUSTER_DNS_IP", clusterDNSIP)
	texts := map[string]string{}
	for _, f := range manifestFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		texts[f] = fill.Replace(string(b))
		out := cp.kubectl(t, texts[f], "apply", "--dry-run=server", "-f", "-")
		t.Logf("kubectl apply --dry-run=server -f %s:\n%s", f, out)
	}
	// The dry run does check: a Service port out of range is refused.
	bad := "apiVersion: v1\nkind: Service\nmetadata:\n  name: bad\n  namespace: kube-system\nspec:\n  ports:\n  - port: 70000\n"
	if out, err := cp.tryKubectl(bad, "apply", "--dry-run=server", "-f", "-"); err == nil {
		t.Errorf("the server's dry run accepted a Service on port 70000:\n%s", out)
	}
	// The Secret the Deployment mounts, as deploy/README.md creates it.
	cp.kubectl(t, "", "-n", "kube-system", "create", "secret", "generic", "compactcache-admin", "--from-file=token="+tokenFile)
	for _, f := range manifestFiles(t) {
		cp.kubectl(t, texts[f], "apply", "-f", "-")
		for _, m := range decodeStrict(t, f) {
			o := m.obj.(metav1.Object)
			gvk := m.obj.GetObjectKind().GroupVersionKind()
			resource := strings.ToLower(gvk.Kind)
			if gvk.Group != "" {
				resource += "." + gvk.Group
			}
			args := []string{"get", resource, o.GetName(), "-o", "name"}
			if ns := o.GetNamespace(); ns != "" {
				args = append(args, "-n", ns)
			}
			t.Logf("stored: %s", strings.TrimSpace(cp.kubectl(t, "", args...)))
		}
	}
}

// dnsTestObjects is what the tests ask about: a dual-stack Service, a
// headless one with the EndpointSlice the controller would write, an
// ExternalName Service, and one of a ClusterIP chosen here. changed gives
// the state after the change: db's second endpoint moved, ext's target
// changed, nope created, api at another ClusterIP (web and the old api
// are deleted apart).
func dnsTestObjects(changed bool) string {
	db2, ext, api := "10.1.0.2", "www.example.org", "10.96.100.1"
	if changed {
		db2, ext, api = "10.1.0.3", "www.example.net", "10.96.100.2"
	}
	s := `apiVersion: v1
kind: Namespace
metadata:
  name: dnstest
---
apiVersion: v1
kind: Service
metadata:
  name: db
  namespace: dnstest
spec:
  clusterIP: None
  ports:
  - name: pg
    port: 5432
    protocol: TCP
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: db-1
  namespace: dnstest
  labels:
    kubernetes.io/service-name: db
addressType: IPv4
ports:
- name: pg
  port: 5432
  protocol: TCP
endpoints:
- addresses: ["10.1.0.1"]
  hostname: db-0
  conditions:
    ready: true
- addresses: ["` + db2 + `"]
  conditions:
    ready: true
---
apiVersion: v1
kind: Service
metadata:
  name: ext
  namespace: dnstest
spec:
  type: ExternalName
  externalName: ` + ext + `
---
apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: dnstest
spec:
  clusterIP: ` + api + `
  ports:
  - name: grpc
    port: 9000
    protocol: TCP
`
	if !changed {
		s += `---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: dnstest
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  ports:
  - name: http
    port: 80
    protocol: TCP
`
	} else {
		s += `---
apiVersion: v1
kind: Service
metadata:
  name: nope
  namespace: dnstest
spec:
  clusterIP: 10.96.100.3
  ports:
  - name: http
    port: 80
    protocol: TCP
`
	}
	return s
}

// dnsServer is a running Corefile and where to reach it.
type dnsServer struct {
	name      string
	in        *instance
	addr      string // where clients ask: the front end, or the block without one
	metrics   string
	adminAddr string
	rw        rewrite
	upstream  *fakeUpstream
}

// startClusterDNS runs the cluster Corefile with its kubernetes plugin on
// kubeconfig. peer, when given, is where COREDNS_PEERS_SERVICE_HOST and
// _PORT point (a peer's admin endpoint), and dnsPort the port its block
// listens on, which the peer shares (SO_REUSEPORT): a block's name holds
// its port, and the warm-up asks the peer for the block of its own name.
func startClusterDNS(t testing.TB, bin, corefile, kubeconfig, tokenFile, peer string, dnsPort int) *dnsServer {
	t.Helper()
	if dnsPort == 0 {
		dnsPort = testenv.FreePort(t)
	}
	rw := rewrite{
		dnsPort:     dnsPort,
		frontPort:   testenv.FreePort(t),
		healthAddr:  fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		readyAddr:   fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		metricsAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		adminAddr:   fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		kubeconfig:  kubeconfig,
		tokenFile:   tokenFile,
	}
	if peer == "" {
		// No peer yet, as for the first pod of a Deployment: nothing listens.
		peer = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	}
	host, port, _ := strings.Cut(peer, ":")
	s := startDNS(t, bin, "", corefile, rw, "http://"+rw.readyAddr+"/ready", "COREDNS_PEERS_SERVICE_HOST="+host, "COREDNS_PEERS_SERVICE_PORT="+port)
	if strings.Contains(s.in.out.String(), "starting server with unsynced Kubernetes API") {
		t.Fatalf("%s: the kubernetes plugin did not sync with the API server", s.name)
	}
	return s
}

// startNodeLocal runs the node-local Corefile with kube-dns-upstream at
// cluster (host:port).
func startNodeLocal(t testing.TB, bin, corefile, cluster string) *dnsServer {
	t.Helper()
	rw := rewrite{
		dnsPort:     testenv.FreePort(t),
		frontPort:   testenv.FreePort(t),
		healthAddr:  fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		metricsAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		snapshotDir: t.TempDir(),
	}
	return startDNS(t, bin, " node-local", corefile, rw, "http://"+rw.healthAddr+"/health", "KUBE_DNS_UPSTREAM_SERVICE_HOST="+cluster)
}

// startDNS runs corefile, changed for the test by rw with an upstream of
// its own, with env, and waits until it listens and ready answers. The
// server is named for its cache, compactcache or the stock cache, and
// role; clients ask the front end, or the block where it has none.
func startDNS(t testing.TB, bin, role, corefile string, rw rewrite, ready string, env ...string) *dnsServer {
	t.Helper()
	s := &dnsServer{name: "compactcache" + role, upstream: startUpstream(t), rw: rw}
	stock := !strings.Contains(corefile, "compactcache")
	if stock {
		s.name = "cache" + role
	}
	s.rw.upstream = s.upstream.addr
	cf, changes := rewriteCorefile(t, corefile, s.rw)
	t.Logf("%s: changed for the test:\n  %s", s.name, strings.Join(changes, "\n  "))
	s.in = start(t, bin, cf, env...)
	waitOutput(t, s.in, "CoreDNS-", 30*time.Second)
	waitHTTP(t, s.in, ready, 30*time.Second)
	s.addr, s.metrics, s.adminAddr = fmt.Sprintf("127.0.0.1:%d", rw.frontPort), "http://"+rw.metricsAddr+"/metrics", rw.adminAddr
	if stock {
		s.addr = fmt.Sprintf("127.0.0.1:%d", rw.dnsPort)
	}
	return s
}

func (s *dnsServer) hits(t testing.TB) float64 {
	t.Helper()
	return sum(scrape(t, s.metrics)["coredns_cache_hits_total"])
}

type probe struct {
	name  string
	qtype uint16
}

func (p probe) String() string { return p.name + " " + dns.TypeToString[p.qtype] }

// answer is a reply as a client compares it: the rcode and the answer
// section's records without their TTLs, sorted (loadbalance rotates
// them), and the TTL: the answer's lowest, or the SOA's in a denial.
type answer struct {
	lines []string
	ttl   uint32
	at    time.Time
}

func (s *dnsServer) ask(t testing.TB, p probe) answer {
	t.Helper()
	at := time.Now()
	a := answerOf(query(t, s.addr, "udp", p.name, p.qtype))
	a.at = at
	return a
}

// answerOf is r as a client compares it.
func answerOf(r *dns.Msg) answer {
	a := answer{lines: []string{dns.RcodeToString[r.Rcode]}}
	var rrs []string
	var ttl uint32
	for i, rr := range r.Answer {
		if i == 0 {
			ttl = rr.Header().Ttl
		}
		f := strings.Fields(rr.String())
		rrs = append(rrs, f[0]+" "+strings.Join(f[3:], " "))
		ttl = min(ttl, rr.Header().Ttl)
	}
	for _, rr := range r.Ns {
		if soa, ok := rr.(*dns.SOA); ok && len(r.Answer) == 0 {
			ttl = soa.Hdr.Ttl
		}
	}
	slices.Sort(rrs)
	a.lines = append(a.lines, rrs...)
	a.ttl = ttl
	return a
}

// differences lists where compactcache's answers differ from the stock
// cache's: the records, or the TTL by more than the second that asking
// one after the other can make.
type differences []string

func (d *differences) add(s string) { *d = append(*d, s) }

func (d *differences) compare(phase string, probes []probe, ours, stock map[probe]answer) {
	for _, p := range probes {
		a, b := ours[p], stock[p]
		switch {
		case !slices.Equal(a.lines, b.lines):
			d.add(fmt.Sprintf("%s, %s: compactcache %v, cache %v", phase, p, a.lines, b.lines))
		case a.ttl > b.ttl+1 || b.ttl > a.ttl+1:
			d.add(fmt.Sprintf("%s, %s: TTL %d with compactcache, %d with cache", phase, p, a.ttl, b.ttl))
		}
	}
}

// stockCorefile puts the stock cache in place of each compactcache block:
// `cache` with the same TTL and zones, and the same success and denial
// caps, where a CAPACITY of 0 (compactcache's byte budget alone) becomes the
// stock default of 9984 entries. What the stock cache has no equivalent for
// (capacity, frontend, snapshot, admin, warmup) goes: clients then ask the
// block itself.
func stockCorefile(corefile string) string {
	var out []string
	depth := 0 // inside a compactcache block: its nesting
	var kept []string
	for _, line := range strings.Split(corefile, "\n") {
		fields := strings.Fields(line)
		if depth == 0 {
			if len(fields) > 0 && fields[0] == "compactcache" {
				indent := line[:len(line)-len(strings.TrimLeft(line, " \t"))]
				args := strings.TrimSuffix(strings.Join(fields[1:], " "), "{")
				out = append(out, strings.TrimRight(indent+"cache "+args, " "))
				if fields[len(fields)-1] == "{" {
					depth, kept = 1, nil
				}
				continue
			}
			out = append(out, line)
			continue
		}
		if depth == 1 && len(fields) > 1 && (fields[0] == "success" || fields[0] == "denial") {
			if fields[1] == "0" {
				fields[1] = "9984"
			}
			kept = append(kept, "    "+strings.Join(fields, " "))
		}
		if strings.HasSuffix(strings.TrimSpace(line), "{") {
			depth++
		}
		if strings.TrimSpace(line) == "}" {
			depth--
		}
		if depth == 0 && len(kept) > 0 {
			indent := out[len(out)-1][:len(out[len(out)-1])-len(strings.TrimLeft(out[len(out)-1], " \t"))]
			out[len(out)-1] += " {"
			for _, k := range kept {
				out = append(out, indent+k)
			}
			out = append(out, indent+"}")
		}
	}
	return strings.Join(out, "\n")
}

func TestStockCorefile(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{".:53 {\n    compactcache 30 {\n        capacity 64MiB\n        frontend :53 {\n            inflight 1024\n        }\n        admin :9154 {\n            token_file /t\n        }\n    }\n    loop\n}\n",
			".:53 {\n    cache 30\n    loop\n}\n"},
		{"cluster.local:53 {\n    compactcache {\n        success 0 30\n        denial 0 5\n        capacity 16MiB\n    }\n}\n",
			"cluster.local:53 {\n    cache {\n        success 9984 30\n        denial 9984 5\n    }\n}\n"},
		{".:53 {\n    compactcache 30 example.org\n}\n", ".:53 {\n    cache 30 example.org\n}\n"},
	} {
		if got := stockCorefile(tc.in); got != tc.want {
			t.Errorf("stockCorefile(%q)\n= %q\nwant %q", tc.in, got, tc.want)
		}
	}
	// The manifests' Corefiles, translated, parse and keep no compactcache.
	for _, m := range []struct{ file, name string }{{"coredns.yaml", "coredns-compactcache"}, {"nodelocaldns.yaml", "node-local-dns"}} {
		cf := stockCorefile(configMapCorefile(t, m.file, m.name))
		for _, b := range corefile(t, cf) {
			if _, ok := b.Tokens["compactcache"]; ok {
				t.Errorf("%s: compactcache left in %v", m.file, b.Keys)
			}
			if _, ok := b.Tokens["cache"]; !ok {
				t.Errorf("%s: no cache in %v", m.file, b.Keys)
			}
		}
	}
}

// queryLoad asks servers the probes and names around them as fast as one
// client a server goes, until the returned function is called, which says
// how many it asked: the load under which a change must show.
func queryLoad(t testing.TB, servers []*dnsServer, probes []probe) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	counts := make([]int, len(servers))
	for i, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Net: "udp", Timeout: time.Second}
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				p := probes[n%len(probes)]
				m := new(dns.Msg)
				m.SetQuestion(p.name, p.qtype)
				if n%3 == 2 { // a name of the zone no Service has
					m.SetQuestion(fmt.Sprintf("load%d.dnstest.svc.cluster.local.", n%50), dns.TypeA)
				}
				if _, _, err := c.Exchange(m, s.addr); err == nil {
					counts[i]++
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	begin := time.Now()
	return func() {
		close(done)
		wg.Wait()
		for i, s := range servers {
			t.Logf("%s: %d queries of load over %.1fs", s.name, counts[i], time.Since(begin).Seconds())
		}
	}
}
