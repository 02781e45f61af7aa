package kube

import (
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/kubernetes"
	"github.com/coredns/coredns/plugin/pkg/fall"
)

// parse parses `kubernetes ARGS` and its block as the compactcache
// block's option parser hands it over: on the option's name.
func parse(t *testing.T, input string) (*Config, error) {
	t.Helper()
	c := caddy.NewTestController("dns", input)
	c.Next()
	args := c.RemainingArgs()
	return Parse(c, args)
}

func TestParse(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		input   string
		watch   bool
		zones   []string
		conn    conn
		podName bool
		err     string
	}{
		{input: "kubernetes", watch: false},
		{input: "kubernetes cluster.local in-addr.arpa ip6.arpa", watch: true, zones: []string{"cluster.local.", "in-addr.arpa.", "ip6.arpa."}},
		{input: "kubernetes Cluster.Local.", watch: true, zones: []string{"cluster.local."}},
		{input: "kubernetes {\n kubeconfig " + kc + " ctx\n}", watch: true, conn: conn{kubeconfig: kc, context: "ctx"}},
		{input: "kubernetes cluster.local {\n endpoint https://10.0.0.1:6443\n tls " + kc + " " + kc + " " + kc + "\n endpoint_pod_names\n}",
			watch: true, zones: []string{"cluster.local."}, conn: conn{endpoint: "https://10.0.0.1:6443", tlsCert: kc, tlsKey: kc, tlsCA: kc}, podName: true},
		{input: "kubernetes {\n kubeconfig /nonexistent/kubeconfig\n}", err: "kubeconfig: open /nonexistent/kubeconfig"},
		{input: "kubernetes {\n endpoint 10.0.0.1:6443\n}", err: `endpoint "10.0.0.1:6443" is not an http or https URL`},
		{input: "kubernetes {\n tls a b\n}", err: "tls wants CERT KEY CACERT"},
		{input: "kubernetes {\n pods verified\n}", err: `unknown option "pods"`},
		{input: "kubernetes {\n endpoint_pod_names yes\n}", err: "endpoint_pod_names takes no arguments"},
		{input: "kubernetes {\n kubeconfig " + kc + "\n endpoint https://a:1\n}", err: "exclude each other"},
	} {
		cfg, err := parse(t, tc.input)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one saying %q", tc.input, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.input, err)
			continue
		}
		if cfg.Watch() != tc.watch || !slices.Equal(cfg.zones, tc.zones) || cfg.conn != tc.conn || cfg.podNames != tc.podName {
			t.Errorf("%q: %+v, want watch %v zones %v conn %+v endpoint_pod_names %v", tc.input, cfg, tc.watch, tc.zones, tc.conn, tc.podName)
		}
	}
}

// TestPluginOptions reads the options of a kubernetes plugin made by the
// plugin's own parser: the fields read with reflect are where this
// version of the plugin keeps them.
func TestPluginOptions(t *testing.T) {
	for _, tc := range []struct {
		block string
		want  pluginOptions
	}{
		{"", pluginOptions{podMode: podsDisabled}},
		{"pods verified\nendpoint_pod_names\nignore empty_service", pluginOptions{podMode: podsVerified, podNames: true, ignoreEmpty: true}},
		{"pods insecure\nzonal", pluginOptions{podMode: podsInsecure, zonal: true}},
	} {
		c := caddy.NewTestController("dns", "kubernetes cluster.local in-addr.arpa {\n"+tc.block+"\n}")
		c.Next()
		k, err := kubernetes.ParseStanza(c)
		if err != nil {
			if tc.want.zonal && strings.Contains(err.Error(), "zonal") {
				t.Skipf("this kubernetes plugin has no zonal option: %v", err)
			}
			t.Fatalf("%q: %v", tc.block, err)
		}
		if got := optionsOf(k); !optionsEqual(got, tc.want) {
			t.Errorf("%q: read %+v, want %+v", tc.block, got, tc.want)
		}
	}
	if got := optionsOf(kubernetes.New([]string{"cluster.local."})); got.podMode != podsDisabled || len(got.missing) != 0 {
		t.Errorf("kubernetes.New: %+v, want pods disabled and every field found", got)
	}
}

// TestPluginServers: the nameserver's addresses are the plugin's local
// IPs, as its setup sets them (boundIPs) and nsAddrs looks them up in the
// EndpointSlices' addresses. The plugin sets them at its startup, which
// runs after compactcache's, where Start reads them (compactcache comes
// before kubernetes in the directive order, and caddy runs the startup
// hooks in the order the setups gave them): none set yet is unknown, any
// address then being one, not a nameserver of no address.
func TestPluginServers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		local []net.IP // nil: not set yet
		want  map[string]struct{}
	}{
		{"set", []net.IP{net.ParseIP("10.1.0.1"), net.ParseIP("fd00::1")}, map[string]struct{}{"10.1.0.1": {}, "fd00::1": {}}},
		{"not set yet", nil, nil},
	} {
		k := kubernetes.New([]string{"cluster.local."})
		if tc.local != nil {
			f := reflect.ValueOf(k).Elem().FieldByName("localIPs")
			reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Set(reflect.ValueOf(tc.local))
		}
		got := optionsOf(k)
		if !maps.Equal(got.servers, tc.want) || (got.servers == nil) != (tc.want == nil) || len(got.missing) != 0 {
			t.Errorf("%s: servers %v (missing %v), want %v", tc.name, got.servers, got.missing, tc.want)
		}
	}
}

func optionsEqual(a, b pluginOptions) bool {
	return a.podMode == b.podMode && a.podNames == b.podNames && a.ignoreEmpty == b.ignoreEmpty && a.zonal == b.zonal && len(a.missing) == 0
}

// TestStartErrors: the option's settings that cannot work stop the start,
// with an error that says what to write instead, and leave no connected
// series: one left at 0 would say for good that a block not running is
// disconnected.
func TestStartErrors(t *testing.T) {
	k := kubernetes.New([]string{"cluster.local."})
	k.Fall = fall.Zero
	target := Target{Flush: newSink().flush, Zones: []string{"."}}
	follow, _ := parse(t, "kubernetes")
	watchDefault, _ := parse(t, "kubernetes {\n endpoint_pod_names\n}")
	watchZones, _ := parse(t, "kubernetes cluster.local")
	for _, tc := range []struct {
		name string
		cfg  *Config
		next []plugin.Handler
		want string
	}{
		{"follow, no plugin", follow, nil, "no kubernetes plugin after compactcache to follow"},
		{"follow, a plugin without a controller", follow, []plugin.Handler{k}, "has no controller"},
		{"watch beside the plugin", watchZones, []plugin.Handler{k}, "write kubernetes alone"},
		{"watch of the root zone", watchDefault, nil, "the root zone is not a cluster's"},
	} {
		_, err := Start(tc.cfg, tc.next, target)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
		if _, ok := gauge(".", ""); ok {
			t.Errorf("%s: a connected series left by a block that did not start", tc.name)
		}
	}
}
