package deploy

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/kube"
	"github.com/coredns/caddy"
	"github.com/miekg/dns"
)

// flushLog records the names a source flushes and when each first came.
type flushLog struct {
	mu    sync.Mutex
	first map[string]time.Time
}

func (l *flushLog) flush(f flush.Flush) admin.Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range f.Names {
		txt, _, _ := dns.UnpackDomainName(n, 0)
		if _, ok := l.first[txt]; !ok {
			l.first[txt] = time.Now()
		}
	}
	return admin.Counts{}
}

// wait waits until every name has been flushed, up to 10s, and returns
// when the last of them first was.
func (l *flushLog) wait(t testing.TB, names []string) time.Time {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		var last time.Time
		missing := ""
		for _, n := range names {
			at, ok := l.first[n]
			if !ok {
				missing = n
				break
			}
			if at.After(last) {
				last = at
			}
		}
		l.mu.Unlock()
		if missing == "" {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never flushed", missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (l *flushLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.first)
}

// TestRealAPIServerWatch runs the watch of its own that a block without
// the kubernetes plugin opts in to (`kubernetes cluster.local in-addr.arpa
// ip6.arpa { kubeconfig … }` in its compactcache block) against the real
// API server, and measures what it costs the API server: its lists and
// watches, and the bytes it reads per change.
func TestRealAPIServerWatch(t *testing.T) {
	cp := startControlPlane(t)
	const n = 100
	cp.kubectl(t, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: load\n", "apply", "-f", "-")
	c := caddy.NewTestController("dns", "kubernetes cluster.local in-addr.arpa ip6.arpa {\n kubeconfig "+cp.kubeconfig+" test\n}")
	c.Next()
	cfg, err := kube.Parse(c, c.RemainingArgs())
	if err != nil {
		t.Fatal(err)
	}
	log := &flushLog{first: map[string]time.Time{}}
	inv, err := kube.Start(cfg, nil, kube.Target{Flush: log.flush, Zones: []string{"cluster.local.", "in-addr.arpa.", "ip6.arpa."}})
	if err != nil {
		t.Fatal(err)
	}
	defer inv.Stop()
	begin := time.Now()
	for !inv.Stats().Connected {
		if time.Since(begin) > 30*time.Second {
			t.Fatalf("the watch not connected 30s after its start: %+v", inv.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	synced := *inv.Stats().API
	t.Logf("connected after %v: %d lists, %d watches, %d other requests, %d bytes read",
		time.Since(begin).Round(10*time.Millisecond), synced.Lists, synced.Watches, synced.Other, synced.Bytes)

	// names are the names name gives the objects.
	names := func(name func(i int) string) []string {
		var out []string
		for i := range n {
			out = append(out, name(i))
		}
		return out
	}
	// Service i, and the endpoint 10.NET.0.i+1 of its slice.
	service := func(i int) string { return fmt.Sprintf("s%d.load.svc.cluster.local.", i) }
	endpoint := func(net int) func(int) string {
		return func(i int) string { return fmt.Sprintf("10-%d-0-%d.s%d.load.svc.cluster.local.", net, i+1, i) }
	}
	objects := func(tmpl string) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "---\n"+tmpl, i, i/250, i%250+1)
		}
		return b.String()
	}
	// step makes one change to n objects, in one kubectl call, and waits
	// for the names it must flush; it logs what the change cost.
	type cost struct {
		what  string
		bytes int64
		after time.Duration
	}
	var costs []cost
	step := func(what, stdin string, want []string, args ...string) {
		t.Helper()
		log.reset()
		before := *inv.Stats().API
		cp.kubectl(t, stdin, args...)
		done := time.Now()
		last := log.wait(t, want)
		after := *inv.Stats().API
		if after.Lists != before.Lists || after.Watches != before.Watches {
			t.Errorf("%s: %d lists and %d watches more: the watch started again", what, after.Lists-before.Lists, after.Watches-before.Watches)
		}
		c := cost{what, (after.Bytes - before.Bytes) / n, last.Sub(done)}
		costs = append(costs, c)
		t.Logf("%-40s %5d bytes read per change; the last name flushed %v after kubectl returned", what, c.bytes, c.after.Round(time.Millisecond))
	}
	svc := "apiVersion: v1\nkind: Service\nmetadata:\n  name: s%d\n  namespace: load\nspec:\n  clusterIP: 10.96.20%d.%d\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n"
	step(fmt.Sprintf("%d Services created", n), objects(svc), names(service), "apply", "-f", "-")
	slice := "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: s%d-1\n  namespace: load\n  labels:\n    kubernetes.io/service-name: s%[1]d\naddressType: IPv4\nports:\n- name: http\n  port: 8080\n  protocol: TCP\nendpoints:\n- addresses: [\"10.3.%[2]d.%[3]d\"]\n  conditions:\n    ready: true\n"
	step(fmt.Sprintf("%d EndpointSlices created", n), objects(slice), names(endpoint(3)), "apply", "-f", "-")
	moved := strings.ReplaceAll(slice, "10.3.", "10.4.")
	step(fmt.Sprintf("%d EndpointSlices' endpoint moved", n), objects(moved), names(endpoint(4)), "apply", "-f", "-")
	step(fmt.Sprintf("%d Services deleted", n), "", names(service), "-n", "load", "delete", "services", "--all", "--wait=false")

	end := *inv.Stats().API
	t.Logf("over the run: %d lists, %d watches, %d other requests (readiness probes), %d bytes read", end.Lists, end.Watches, end.Other, end.Bytes)
	if end.Watches < 2 || end.Watches > 4 {
		t.Errorf("%d watches, want the two informers' (Services, EndpointSlices), and no more than a restart each", end.Watches)
	}
	for _, c := range costs {
		if c.after > time.Second {
			t.Errorf("%s: flushed %v after kubectl returned, want within 1s", c.what, c.after)
		}
	}
	if st := inv.Stats(); st.Services < n || st.Endpoints < 2*n || st.Source != "watch" {
		t.Errorf("stats %+v: want at least %d Service changes and %d EndpointSlice changes, from a watch", st, n, 2*n)
	}

	// The API server lost: the watch says so within its probe's period.
	cp.apiserver.cmd.Process.Kill()
	<-cp.apiserver.exited
	lost := time.Now()
	for inv.Stats().Connected && time.Since(lost) < 30*time.Second {
		time.Sleep(100 * time.Millisecond)
	}
	if st := inv.Stats(); st.Connected || st.Disconnects != 1 {
		t.Errorf("30s after the API server was killed: connected %v, %d disconnects; want false and 1", st.Connected, st.Disconnects)
	} else {
		t.Logf("the API server killed: the watch said so %.1fs later", time.Since(lost).Seconds())
	}
}
