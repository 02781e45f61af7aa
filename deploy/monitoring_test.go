package deploy

import (
	"context"
	encjson "encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache" // registers compactcache and its metrics
	"github.com/compactcache/compactcache/internal/admin"
	"github.com/compactcache/compactcache/internal/flush"
	"github.com/compactcache/compactcache/internal/kube"
	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	_ "github.com/coredns/coredns/plugin/metrics"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	dashboardFile = "grafana/compactcache.json"
	alertsFile    = "prometheus/alerts.yaml"
)

// metricName finds the metric names in a PromQL expression: the families of
// the plugin and those of the Go and process collectors CoreDNS registers.
var metricName = regexp.MustCompile(`\b(?:coredns|process|go)_[a-zA-Z0-9_:]*[a-zA-Z0-9]\b`)

type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	GridPos     struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []target `json:"targets"`
}

type target struct {
	RefID string `json:"refId"`
	Expr  string `json:"expr"`
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func readDashboard(t testing.TB) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	dec := encjson.NewDecoder(strings.NewReader(string(data)))
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func readAlerts(t testing.TB) ruleFile {
	t.Helper()
	data, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(data, &rf); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	return rf
}

// dashboardMetrics returns, per metric name, where the dashboard uses it.
func dashboardMetrics(t testing.TB) map[string][]string {
	t.Helper()
	d := readDashboard(t)
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				out[n] = append(out[n], p.Title)
			}
		}
	}
	for _, v := range d.Templating.List {
		for _, n := range metricName.FindAllString(v.Definition, -1) {
			out[n] = append(out[n], "variable "+v.Name)
		}
	}
	return out
}

func alertMetrics(t testing.TB) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, g := range readAlerts(t).Groups {
		for _, r := range g.Rules {
			for _, n := range metricName.FindAllString(r.Expr, -1) {
				out[n] = append(out[n], r.Alert)
			}
		}
	}
	return out
}

// monitoredMetrics returns every metric name the dashboard or the alerts use.
func monitoredMetrics(t testing.TB) []string {
	t.Helper()
	var names []string
	for _, m := range []map[string][]string{dashboardMetrics(t), alertMetrics(t)} {
		for n := range m {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	return names
}

// exported serves queries through a compactcache built from Corefile text,
// as CoreDNS builds it, so that every metric family of the plugin has a
// child, and returns the help texts of the families the default registry
// gathers, by name.
func exported(t testing.TB) map[string]string {
	t.Helper()
	// With a shared tier, whose families have their series once it starts.
	r := testenv.StartRedis(t)
	ctrl := caddy.NewTestController("dns", "compactcache {\n capacity 1MiB\n shared redis://"+r.Addr+"\n}")
	ctrl.ServerBlockKeys = []string{".:53"}
	setup, err := caddy.DirectiveAction("dns", "compactcache")
	if err != nil {
		t.Fatal(err)
	}
	if err := setup(ctrl); err != nil {
		t.Fatal(err)
	}
	cfg := dnsserver.GetConfig(ctrl)
	if len(cfg.Plugin) != 1 {
		t.Fatalf("%d plugins set up, want 1", len(cfg.Plugin))
	}
	next := plugin.HandlerFunc(func(_ context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: []byte{192, 0, 2, 1}}}
		w.WriteMsg(m)
		return dns.RcodeSuccess, nil
	})
	h := cfg.Plugin[0](next)
	h.(*compactcache.Cache).StartShared("")
	t.Cleanup(h.(*compactcache.Cache).StopShared)
	// With invalidation from the Kubernetes API, by a watch of its own of an
	// API server that is not there: its families have their series as it
	// starts.
	kc := caddy.NewTestController("dns", "kubernetes cluster.local {\n endpoint http://127.0.0.1:1\n}")
	kc.Next()
	kcfg, err := kube.Parse(kc, kc.RemainingArgs())
	if err != nil {
		t.Fatal(err)
	}
	inv, err := kube.Start(kcfg, nil, kube.Target{Flush: func(flush.Flush) admin.Counts { return admin.Counts{} }, Zones: []string{"cluster.local."}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inv.Stop)
	// The server label comes from the server in the request's context.
	ctx := context.WithValue(context.Background(), dnsserver.Key{}, &dnsserver.Server{Addr: "dns://:53"})
	for range 2 { // a miss, then a hit
		req := new(dns.Msg)
		req.SetQuestion("www.example.org.", dns.TypeA)
		if _, err := h.ServeDNS(ctx, &writer{}, req); err != nil {
			t.Fatal(err)
		}
	}

	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	help := map[string]string{}
	for _, mf := range mfs {
		help[mf.GetName()] = mf.GetHelp()
	}
	return help
}

// writer is a dns.ResponseWriter over UDP that keeps nothing.
type writer struct{ dns.ResponseWriter }

func (*writer) WriteMsg(*dns.Msg) error     { return nil }
func (*writer) Write(b []byte) (int, error) { return len(b), nil }
func (*writer) LocalAddr() net.Addr         { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53} }
func (*writer) RemoteAddr() net.Addr        { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000} }
func (*writer) Network() string             { return "udp" }

// stockFamilies are the stock cache's families, which compactcache feeds so
// that what is built for CoreDNS's metrics works with it.
var stockFamilies = []string{"coredns_cache_entries", "coredns_cache_requests_total", "coredns_cache_hits_total",
	"coredns_cache_misses_total", "coredns_cache_drops_total", "coredns_cache_prefetch_total",
	"coredns_cache_served_stale_total", "coredns_cache_evictions_total"}

// deprecated reports whether a family's help says it is on its way out: the
// duplicates of stock families among compactcache's, and the stock misses.
func deprecated(help string) bool { return strings.Contains(help, "Deprecated") }

func TestMonitoringNamesExportedMetrics(t *testing.T) {
	have := exported(t)
	for _, n := range stockFamilies {
		if _, ok := have[n]; !ok {
			t.Errorf("compactcache does not feed the stock family %s", n)
		}
	}
	// The families the dashboard is to show: the plugin's, less those on
	// their way out.
	var current []string
	for n, help := range have {
		if (strings.HasPrefix(n, "coredns_compactcache_") || slices.Contains(stockFamilies, n)) && !deprecated(help) {
			current = append(current, n)
		}
	}
	slices.Sort(current)
	t.Logf("the plugin exports %d current families: %v", len(current), current)

	for file, used := range map[string]map[string][]string{dashboardFile: dashboardMetrics(t), alertsFile: alertMetrics(t)} {
		if len(used) == 0 {
			t.Errorf("%s names no metric", file)
		}
		for n, where := range used {
			if processFamily(n) {
				continue // TestProcessPanelsExported
			}
			if n == "coredns_plugin_enabled" {
				continue // the prometheus plugin's: TestDashboardVariablesAtStartup
			}
			help, ok := have[family(n, have)]
			switch {
			case !ok:
				t.Errorf("%s: %s (in %v) is not exported", file, n, where)
			case deprecated(help):
				t.Errorf("%s: %s (in %v) is deprecated: %s", file, n, where, help)
			}
		}
	}

	// The dashboard shows every current family of the plugin: those above,
	// and those of the front end, the admin endpoint and snapshots
	// (TestProcessPanelsExported).
	dash := map[string][]string{}
	for n, where := range dashboardMetrics(t) {
		dash[family(n, have)] = where
	}
	for _, n := range current {
		if _, ok := dash[n]; !ok {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
	// The alerts cover what the brief asks of them.
	alerts := alertMetrics(t)
	for _, n := range []string{"coredns_compactcache_bytes", "coredns_compactcache_capacity_bytes", "coredns_cache_hits_total",
		"coredns_cache_requests_total", "coredns_cache_served_stale_total", "coredns_cache_drops_total", "coredns_compactcache_refused_total"} {
		if _, ok := alerts[n]; !ok {
			t.Errorf("no alert uses %s", n)
		}
	}
}

func TestDashboardLayout(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard needs a uid and a title")
	}
	ids := map[int]bool{}
	type rect struct{ x, y, w, h int }
	var placed []rect
	var titles []string
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		r := rect{g.X, g.Y, g.W, g.H}
		for _, q := range placed {
			if r.x < q.x+q.w && q.x < r.x+r.w && r.y < q.y+q.h && q.y < r.y+r.h {
				t.Errorf("panel %q overlaps another at %+v", p.Title, g)
			}
		}
		placed = append(placed, r)
		if p.Type == "row" {
			continue
		}
		titles = append(titles, p.Title)
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: target %+v needs an expr and a unique refId", p.Title, tg)
			}
			refs[tg.RefID] = true
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") || strings.Count(tg.Expr, "{") != strings.Count(tg.Expr, "}") {
				t.Errorf("panel %q: unbalanced expression %s", p.Title, tg.Expr)
			}
		}
	}
	for _, want := range []string{"Hit ratio", "Bytes in use vs capacity", "Entries by type", "Evictions by type", "Stale served", "Prefetches", "Drops and refused"} {
		if !slices.Contains(titles, want) {
			t.Errorf("no panel %q", want)
		}
	}
}

func TestAlertRules(t *testing.T) {
	rf := readAlerts(t)
	seen := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" || r.For == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %+v needs alert, expr, for, a severity and a summary", r)
			}
			if seen[r.Alert] {
				t.Errorf("alert %s twice", r.Alert)
			}
			seen[r.Alert] = true
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") {
				t.Errorf("%s: unbalanced parentheses", r.Alert)
			}
		}
	}
	// promtool, where it is installed (Debian's prometheus package), checks
	// the expressions for real.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Log("promtool not installed: expressions checked for balance only")
		return
	}
	out, err := exec.Command(promtool, "check", "rules", filepath.Clean(alertsFile)).CombinedOutput()
	if err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// frontendFamilies starts the names of the families that only a block with
// a front end exports: exported builds none.
const frontendFamilies = "coredns_compactcache_frontend_"

// processFamilies start the names of the families that have series only in
// a process that runs the options they count: the front end, the admin
// endpoint, snapshots and warm-ups. exported runs none of them;
// TestProcessPanelsExported checks them against the custom build.
var processFamilies = []string{frontendFamilies, "coredns_compactcache_admin_", "coredns_compactcache_snapshot_"}

func processFamily(n string) bool {
	return slices.ContainsFunc(processFamilies, func(p string) bool { return strings.HasPrefix(n, p) })
}

// TestProcessPanelsExported: the custom build serving a block with a front
// end, an admin endpoint and a damaged snapshot exports every such
// family the dashboard names, and the dashboard shows each of them.
func TestProcessPanelsExported(t *testing.T) {
	var names []string
	for n := range dashboardMetrics(t) {
		if processFamily(n) {
			names = append(names, n)
		}
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, frontendFamilies) }) {
		t.Fatalf("%s has no panel of the front end", dashboardFile)
	}
	bin := corednsBinary(t)
	frontend := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	adminAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	port := testenv.FreePort(t)
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A damaged snapshot file: not read, moved aside, counted.
	snap := filepath.Join(dir, "cache.snap")
	if err := os.WriteFile(snap, []byte("not a snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	in := start(t, bin, fmt.Sprintf(`.:%d {
	bind 127.0.0.1
	prometheus %s
	compactcache {
		frontend udp://%s
		admin %s {
			token_file %s
		}
		snapshot %s 5m
	}
	whoami
}
`, port, metricsAddr, frontend, adminAddr, token, snap))
	// CoreDNS prints its version once every block's startup has run, the
	// front end's included; the metrics listener answers before that.
	waitOutput(t, in, "CoreDNS-", 30*time.Second)
	waitHTTP(t, in, "http://"+metricsAddr+"/metrics", 30*time.Second)
	for range 2 { // through the chain, then a hit
		if r := query(t, frontend, "udp", "www.example.org", dns.TypeA); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("through the front end: rcode %s", dns.RcodeToString[r.Rcode])
		}
	}
	// An admin request with the token, and one with another.
	for _, tok := range []string{"0123456789abcdef0123456789abcdef", "wrong-token-wrong-token"} {
		req, err := http.NewRequest(http.MethodGet, "http://"+adminAddr+admin.Prefix+admin.OpStats, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// A hit is counted once its reply is sent, after the client may have
	// read it: scraped until both requests are counted, for a while.
	var m map[string][]sample
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		m = scrape(t, "http://"+metricsAddr+"/metrics")
		if sum(m[frontendFamilies+"requests_total"]) >= 2 || time.Now().After(deadline) {
			break
		}
	}
	for _, n := range names {
		if len(m[n]) == 0 {
			t.Errorf("the dashboard names %s, which this process does not export", n)
		}
	}
	dash := dashboardMetrics(t)
	for n := range m {
		if _, ok := dash[n]; processFamily(n) && !ok {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
	if got := sum(m[frontendFamilies+"requests_total"]); got != 2 {
		t.Errorf("%srequests_total sums to %v over its results, want the 2 requests", frontendFamilies, got)
	}
	in.stop(t, 20*time.Second)
}

// family returns the family a series name n belongs to: a histogram's
// buckets, sum and count are its family's.
func family(n string, have map[string]string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(n, suffix); ok {
			if _, ok := have[base]; ok {
				return base
			}
		}
	}
	return n
}

// readmeGlosses returns, from the row of family in the README's Metrics
// table, what each label value it names in backquotes is said to count:
// "`hit` (answered from the cache, its reply sent)" gives hit and
// "answered from the cache, its reply sent", backquotes dropped.
func readmeGlosses(t testing.TB, family string) map[string]string {
	t.Helper()
	return docGlosses(t, "README.md", family)
}

// docGlosses is readmeGlosses of the metrics table of doc, a path from the
// repository's root.
func docGlosses(t testing.TB, doc, family string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", doc))
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "| `"+family+"{") {
			row = line
		}
	}
	if row == "" {
		t.Fatalf("%s's metrics table has no row for %s", doc, family)
	}
	out := map[string]string{}
	for _, m := range regexp.MustCompile("`([a-z_]+)` \\(([^)]*)\\)").FindAllStringSubmatch(row, -1) {
		out[m[1]] = strings.ReplaceAll(m[2], "`", "")
	}
	if len(out) == 0 {
		t.Fatalf("%s's row of %s glosses no label value", doc, family)
	}
	return out
}

// TestFrontendPanelGlossesAsREADME: the dashboard's panel of the front
// end's requests says of each result what README.md's Metrics table says
// it counts (the panel may add advice after it), so that a result whose
// meaning changed in the plugin does not keep its old meaning there.
func TestFrontendPanelGlossesAsREADME(t *testing.T) {
	panelGlosses(t, frontendFamilies+"requests_total", "README.md", readmeGlosses(t, "coredns_compactcache_frontend_requests_total"))
}

// TestSharedPanelGlossesAsDocs: the dashboard's panel of the shared tier's
// lookups says of each result what docs/shared.md's metrics table says it
// counts.
func TestSharedPanelGlossesAsDocs(t *testing.T) {
	panelGlosses(t, "coredns_compactcache_shared_requests_total", "docs/shared.md", docGlosses(t, "docs/shared.md", "shared_requests_total"))
}

// panelGlosses checks that the panels that show family gloss each label
// value as doc does in glosses.
func panelGlosses(t *testing.T, family, doc string, glosses map[string]string) {
	t.Helper()
	found := false
	for _, p := range readDashboard(t).Panels {
		if !slices.ContainsFunc(p.Targets, func(tg target) bool { return strings.Contains(tg.Expr, family) }) {
			continue
		}
		found = true
		for result, gloss := range glosses {
			if !strings.Contains(p.Description, result+" ("+gloss) {
				t.Errorf("panel %q: %s should read %q, as %s says; the description: %s", p.Title, result, result+" ("+gloss+")", doc, p.Description)
			}
		}
	}
	if !found {
		t.Fatalf("no panel shows %s", family)
	}
}

// TestDashboardVariablesAtStartup: the dashboard's variables list a block
// as soon as its server has started, before its first request, under the
// server label its panels' series carry.
func TestDashboardVariablesAtStartup(t *testing.T) {
	const zone = "variables.example."
	inst := startCorefile(t, zone+":0 {\n bind 127.0.0.1\n prometheus 127.0.0.1:0\n compactcache\n}\n")
	variable := regexp.MustCompile(`^label_values\((\w+)(?:\{([^}]*)\})?, *(\w+)\)$`)
	matcher := regexp.MustCompile(`(\w+)="([^"]*)"`)
	listed := map[string]map[string]bool{} // values by variable
	for _, v := range readDashboard(t).Templating.List {
		m := variable.FindStringSubmatch(v.Definition)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
			labels[lm[1]] = lm[2]
		}
		listed[v.Name] = map[string]bool{}
		for _, s := range series(t, m[1], labels) {
			listed[v.Name][s[m[3]]] = true
		}
		if len(listed[v.Name]) == 0 {
			t.Errorf("variable %s lists nothing before the first request: %s has no series", v.Name, v.Definition)
		}
	}

	req := new(dns.Msg).SetQuestion(zone, dns.TypeA)
	if _, err := dns.Exchange(req, inst.Servers()[0].LocalAddr().String()); err != nil {
		t.Fatal(err)
	}
	served := series(t, "coredns_cache_requests_total", map[string]string{"zones": zone})
	if len(served) == 0 {
		t.Fatal("no request counted")
	}
	for _, s := range served {
		if !listed["server"][s["server"]] {
			t.Errorf("the server variable does not list %s, whose series the panels show", s["server"])
		}
	}
}

// series returns the labels of the series of family that carry labels.
func series(t testing.TB, family string, labels map[string]string) []map[string]string {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if carries(got, labels) {
				out = append(out, got)
			}
		}
	}
	return out
}

// carries reports whether got holds each of labels.
func carries(got, labels map[string]string) bool {
	for k, v := range labels {
		if got[k] != v {
			return false
		}
	}
	return true
}

// TestMemoryPanelAsSizing: the memory panel says how the container limit
// follows from what it plots (GOMEMLIMIT and the budgets), as the sizing
// formula and the manifests have it: limit = GOMEMLIMIT + budgets + the
// rest, the stores being mapped outside the Go heap.
func TestMemoryPanelAsSizing(t *testing.T) {
	var desc string
	for _, p := range readDashboard(t).Panels {
		if slices.ContainsFunc(p.Targets, func(tg target) bool { return strings.Contains(tg.Expr, "go_gc_gomemlimit_bytes") }) {
			desc = p.Description
		}
	}
	m := regexp.MustCompile(`container limit is GOMEMLIMIT \+ (the (?:sum of the )?budgets \+ )?([0-9]+)MiB`).FindStringSubmatch(desc)
	if m == nil {
		t.Fatalf("the memory panel does not say how the container limit follows from GOMEMLIMIT: %s", desc)
	}
	rest, _ := strconv.ParseInt(m[2], 10, 64)
	for _, file := range []string{"coredns.yaml", "nodelocaldns.yaml"} {
		ms := decodeStrict(t, filepath.Join("kubernetes", file))
		var spec corev1.PodSpec
		for _, o := range ms {
			switch o := o.obj.(type) {
			case *appsv1.Deployment:
				spec = o.Spec.Template.Spec
			case *appsv1.DaemonSet:
				spec = o.Spec.Template.Spec
			}
		}
		c := spec.Containers[0]
		cm := object[*corev1.ConfigMap](t, ms, configVolume(t, spec, c))
		var total int64
		for _, b := range budgets(t, corefile(t, cm.Data["Corefile"])) {
			total += b
		}
		gomem, err := goMemLimit(envValue(c, "GOMEMLIMIT"))
		if err != nil {
			t.Fatal(err)
		}
		limit := c.Resources.Limits.Memory().Value()
		said := gomem + rest*mib
		if m[1] != "" {
			said += total
		}
		if said != limit {
			t.Errorf("%s: limit %dMiB = GOMEMLIMIT %dMiB + budgets %dMiB + %dMiB; the memory panel says %q (%dMiB)",
				file, limit/mib, gomem/mib, total/mib, (limit-gomem-total)/mib, m[0], said/mib)
		}
	}
}
