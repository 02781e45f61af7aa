package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compactcache/compactcache"
	"github.com/coredns/caddy/caddyfile"
	"github.com/coredns/coredns/core/dnsserver"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// manifest is one document of a manifest file, decoded.
type manifest struct {
	file string
	obj  runtime.Object
}

// decodeStrict decodes every document of a YAML file into the built-in API
// type its apiVersion and kind name, failing on unknown or duplicate fields
// and on kinds the client-go scheme does not know.
func decodeStrict(t testing.TB, path string) []manifest {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ser := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []manifest
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", path, i, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, gvk, err := ser.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: document %d does not decode strictly: %v", path, i, err)
		}
		if gvk.Version == "" || gvk.Kind == "" {
			t.Fatalf("%s: document %d has no apiVersion or kind", path, i)
		}
		out = append(out, manifest{file: filepath.Base(path), obj: obj})
	}
	return out
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for line := range strings.SplitSeq(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

func manifestFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests under kubernetes/: %v", err)
	}
	return files
}

// object returns the one object of type T named name in ms.
func object[T runtime.Object](t testing.TB, ms []manifest, name string) T {
	t.Helper()
	var found []T
	for _, m := range ms {
		if o, ok := m.obj.(T); ok {
			if a, ok := any(o).(metav1.Object); ok && a.GetName() == name {
				found = append(found, o)
			}
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want one %T named %q, found %d", zero, name, len(found))
	}
	return found[0]
}

func TestManifestsDecodeStrictly(t *testing.T) {
	for _, f := range manifestFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			ms := decodeStrict(t, f)
			if len(ms) == 0 {
				t.Fatal("no objects")
			}
			for _, m := range ms {
				o := m.obj.(metav1.Object)
				if ns := o.GetNamespace(); ns != "" && ns != "kube-system" {
					t.Errorf("%T %s in namespace %q, want kube-system", m.obj, o.GetName(), ns)
				}
				t.Logf("%T %s", m.obj, o.GetName())
			}
		})
	}

	// The strict decoder does catch what a typo makes of a manifest.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  clusterIp: 10.0.0.1\n"), 0o644)
	ser := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, json.SerializerOptions{Yaml: true, Strict: true})
	data, _ := os.ReadFile(bad)
	if _, _, err := ser.Decode(data, nil, nil); err == nil || !runtime.IsStrictDecodingError(err) {
		t.Errorf("a misspelt field decoded: %v", err)
	}
}

// corefile parses the Corefile text of a ConfigMap into server blocks, with
// the directives of the custom build.
func corefile(t testing.TB, text string) []caddyfile.ServerBlock {
	t.Helper()
	directives := append(slices.Clone(dnsserver.Directives), "compactcache")
	blocks, err := caddyfile.Parse("Corefile", strings.NewReader(text), directives)
	if err != nil {
		t.Fatalf("Corefile does not parse: %v\n%s", err, text)
	}
	return blocks
}

// budgets returns each compactcache block's byte budget, in order.
func budgets(t testing.TB, blocks []caddyfile.ServerBlock) []int64 {
	t.Helper()
	var out []int64
	for _, b := range blocks {
		toks, ok := b.Tokens["compactcache"]
		if !ok {
			continue
		}
		budget := compactcache.New().Stats().Capacity // a block's without capacity
		for i, tok := range toks {
			if tok.Text == "capacity" && i+1 < len(toks) {
				n, err := compactcache.ParseSize(toks[i+1].Text)
				if err != nil {
					t.Fatalf("%v: capacity: %v", b.Keys, err)
				}
				budget = n
			}
		}
		out = append(out, budget)
	}
	return out
}

// goMemLimit parses GOMEMLIMIT as the Go runtime does: bytes with an
// optional B, KiB, MiB, GiB or TiB.
func goMemLimit(s string) (int64, error) {
	m := regexp.MustCompile(`^([0-9]+)(B|KiB|MiB|GiB|TiB)?$`).FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("GOMEMLIMIT %q is not a number of bytes with an optional unit", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, err
	}
	shift := map[string]uint{"": 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m[2]]
	return n << shift, nil
}

func TestSizingFormula(t *testing.T) {
	for _, tc := range []struct{ budget, gomem, limit int64 }{
		{256 * mib, 128 * mib, 480 * mib},
		{64 * mib, 80 * mib, 240 * mib},
		{1 << 30, 320 * mib, 1440 * mib},
		{1*mib + 1, 64 * mib, 162 * mib}, // 1.25MiB and a byte round up to 2MiB; the budget to 2MiB
	} {
		if got := GoMemLimit(tc.budget); got != tc.gomem {
			t.Errorf("GoMemLimit(%d) = %d MiB, want %d MiB", tc.budget, got/mib, tc.gomem/mib)
		}
		if got := MemoryLimit(tc.budget); got != tc.limit {
			t.Errorf("MemoryLimit(%d) = %d MiB, want %d MiB", tc.budget, got/mib, tc.limit/mib)
		}
	}
}

// checkMemory checks that the container's memory limit and request and its
// GOMEMLIMIT follow the formula for the budgets of the Corefile it serves.
func checkMemory(t testing.TB, c corev1.Container, blocks []caddyfile.ServerBlock) {
	t.Helper()
	bs := budgets(t, blocks)
	for _, e := range memoryErrors(c, bs) {
		t.Error(e)
	}
	t.Logf("container %s: budgets %v MiB, limit %s, GOMEMLIMIT %s", c.Name, mibs(bs),
		c.Resources.Limits.Memory().String(), envValue(c, "GOMEMLIMIT"))
}

func memoryErrors(c corev1.Container, bs []int64) []string {
	if len(bs) == 0 {
		return []string{"the Corefile has no compactcache block"}
	}
	var total int64
	for _, b := range bs {
		total += b
	}
	var errs []string
	want := MemoryLimit(total)
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		return []string{fmt.Sprintf("container %s has no memory limit", c.Name)}
	}
	if limit.Value() != want {
		errs = append(errs, fmt.Sprintf("container %s: memory limit %s, want %dMi for budgets %v MiB (budget*5/4 + 64MiB + 96MiB)",
			c.Name, limit.String(), want/mib, mibs(bs)))
	}
	if req := c.Resources.Requests[corev1.ResourceMemory]; req.Cmp(limit) != 0 {
		errs = append(errs, fmt.Sprintf("container %s: memory request %s, want it equal to the limit %s", c.Name, req.String(), limit.String()))
	}
	gomem := envValue(c, "GOMEMLIMIT")
	n, err := goMemLimit(gomem)
	if err != nil {
		return append(errs, fmt.Sprintf("container %s: %v", c.Name, err))
	}
	if w := GoMemLimit(total); n != w {
		errs = append(errs, fmt.Sprintf("container %s: GOMEMLIMIT %s, want %dMiB for budgets %v MiB (budget/4 + 64MiB)", c.Name, gomem, w/mib, mibs(bs)))
	}
	return errs
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func mibs(bs []int64) []int64 {
	out := make([]int64, len(bs))
	for i, b := range bs {
		out[i] = b / mib
	}
	return out
}

// directiveArgs returns the arguments of each occurrence of a directive in
// the block: the tokens on its line after its name.
func directiveArgs(b caddyfile.ServerBlock, name string) [][]string {
	var out [][]string
	toks := b.Tokens[name]
	for i := 0; i < len(toks); i++ {
		if toks[i].Text != name {
			continue
		}
		var args []string
		for j := i + 1; j < len(toks) && toks[j].Line == toks[i].Line && toks[j].Text != "{"; j++ {
			args = append(args, toks[j].Text)
		}
		out = append(out, args)
	}
	return out
}

// frontendAddrs returns the addresses of the front end that compactcache
// opens in block b, or none.
func frontendAddrs(b caddyfile.ServerBlock) []string {
	toks := b.Tokens["compactcache"]
	for i, tok := range toks {
		if tok.Text != "frontend" {
			continue
		}
		var addrs []string
		for j := i + 1; j < len(toks) && toks[j].Line == tok.Line && toks[j].Text != "{"; j++ {
			addrs = append(addrs, toks[j].Text)
		}
		return addrs
	}
	return nil
}

// port returns the port of an address such as :8080 or 169.254.20.10:8080.
func port(t testing.TB, addr, dflt string) string {
	t.Helper()
	if addr == "" {
		addr = dflt
	}
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		t.Fatalf("address %q has no port", addr)
	}
	return addr[i+1:]
}

func containerPort(t testing.TB, c corev1.Container, name string) corev1.ContainerPort {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("container %s has no port %q", c.Name, name)
	return corev1.ContainerPort{}
}

func selects(t testing.TB, sel *metav1.LabelSelector, lbls map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(labels.Set(lbls))
}

// checkPodSecurity checks what port 53 as a non-root user needs (README,
// "Port 53 without root").
func checkPodSecurity(t testing.TB, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatalf("container %s has no securityContext.capabilities", c.Name)
	}
	if !slices.Contains(sc.Capabilities.Add, "NET_BIND_SERVICE") {
		t.Errorf("container %s does not add NET_BIND_SERVICE: %v", c.Name, sc.Capabilities.Add)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("container %s does not drop ALL: %v", c.Name, sc.Capabilities.Drop)
	}
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Errorf("container %s: want runAsNonRoot and runAsUser 65532", c.Name)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container %s: want readOnlyRootFilesystem", c.Name)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container %s: want allowPrivilegeEscalation: false", c.Name)
	}
	if !strings.HasPrefix(c.Image, "COREDNS_IMAGE") {
		t.Errorf("container %s: image %q, want the COREDNS_IMAGE placeholder", c.Name, c.Image)
	}
	if !slices.Equal(c.Args, []string{"-conf", "/etc/coredns/Corefile"}) || len(c.Command) != 0 {
		t.Errorf("container %s: command %q args %q, want the image's entrypoint with -conf /etc/coredns/Corefile", c.Name, c.Command, c.Args)
	}
}

// configVolume checks that the container mounts the ConfigMap's Corefile at
// /etc/coredns/Corefile and returns the ConfigMap's name.
func configVolume(t testing.TB, spec corev1.PodSpec, c corev1.Container) string {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != "/etc/coredns" {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				for _, it := range v.ConfigMap.Items {
					if it.Key == "Corefile" && it.Path == "Corefile" {
						return v.ConfigMap.Name
					}
				}
			}
		}
	}
	t.Fatalf("container %s mounts no ConfigMap's Corefile at /etc/coredns/Corefile", c.Name)
	return ""
}

func TestClusterDNS(t *testing.T) {
	ms := decodeStrict(t, filepath.Join("kubernetes", "coredns.yaml"))

	sa := object[*corev1.ServiceAccount](t, ms, "coredns")
	role := object[*rbacv1.ClusterRole](t, ms, "system:coredns")
	binding := object[*rbacv1.ClusterRoleBinding](t, ms, "system:coredns")
	dep := object[*appsv1.Deployment](t, ms, "coredns")
	svc := object[*corev1.Service](t, ms, "kube-dns")
	pdb := object[*policyv1.PodDisruptionBudget](t, ms, "coredns")

	// What the kubernetes plugin lists and watches.
	need := map[string][]string{"": {"endpoints", "services", "pods", "namespaces"}, "discovery.k8s.io": {"endpointslices"}}
	for group, resources := range need {
		for _, res := range resources {
			ok := false
			for _, r := range role.Rules {
				if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) &&
					slices.Contains(r.Verbs, "list") && slices.Contains(r.Verbs, "watch") {
					ok = true
				}
			}
			if !ok {
				t.Errorf("ClusterRole lacks list and watch on %q %s", group, res)
			}
		}
	}
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 ||
		binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("ClusterRoleBinding %+v does not bind %s to %s", binding, role.Name, sa.Name)
	}

	pod := dep.Spec.Template
	if pod.Labels["k8s-app"] != "kube-dns" || dep.Labels["k8s-app"] != "kube-dns" || svc.Labels["k8s-app"] != "kube-dns" {
		t.Error("the Deployment, its pods and the Service must carry k8s-app: kube-dns")
	}
	if !selects(t, dep.Spec.Selector, pod.Labels) {
		t.Error("the Deployment's selector does not select its pods")
	}
	if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, pod.Labels) {
		t.Error("the kube-dns Service does not select the pods")
	}
	if !selects(t, pdb.Spec.Selector, pod.Labels) {
		t.Error("the PodDisruptionBudget does not select the pods")
	}
	if svc.Spec.ClusterIP != "CLUSTER_DNS_IP" {
		t.Errorf("Service clusterIP %q, want the CLUSTER_DNS_IP placeholder", svc.Spec.ClusterIP)
	}
	if pod.Spec.ServiceAccountName != sa.Name {
		t.Errorf("pods run as %q, want %q", pod.Spec.ServiceAccountName, sa.Name)
	}
	if pod.Spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName %q", pod.Spec.PriorityClassName)
	}
	if pod.Spec.DNSPolicy != corev1.DNSDefault {
		t.Errorf("dnsPolicy %q, want Default (the node's resolv.conf for forward)", pod.Spec.DNSPolicy)
	}
	if a := pod.Spec.Affinity; a == nil || a.PodAntiAffinity == nil {
		t.Error("no pod anti-affinity")
	}
	if r := dep.Spec.Replicas; r == nil || *r < 2 || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() >= int(*r) {
		t.Error("the PodDisruptionBudget must leave a replica up while letting one go")
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	checkPodSecurity(t, c)

	cm := object[*corev1.ConfigMap](t, ms, configVolume(t, pod.Spec, c))
	blocks := corefile(t, cm.Data["Corefile"])
	checkMemory(t, c, blocks)

	// The probes and ports agree with the Corefile.
	if len(blocks) != 1 {
		t.Fatalf("%d server blocks, want 1", len(blocks))
	}
	b := blocks[0]
	for _, d := range []string{"errors", "health", "ready", "kubernetes", "prometheus", "forward", "compactcache", "loop", "reload", "loadbalance"} {
		if _, ok := b.Tokens[d]; !ok {
			t.Errorf("the Corefile lacks %s", d)
		}
	}
	if _, ok := b.Tokens["cache"]; ok {
		t.Error("the Corefile uses the stock cache besides compactcache")
	}
	if !slices.ContainsFunc(b.Tokens["compactcache"], func(tok caddyfile.Token) bool { return tok.Text == "kubernetes" }) {
		t.Error("compactcache does not follow the kubernetes plugin's changes (its kubernetes option)")
	}
	health := directiveArgs(b, "health")
	ready := directiveArgs(b, "ready")
	prom := directiveArgs(b, "prometheus")
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" ||
		p.HTTPGet.Port.String() != port(t, strings.Join(health[0], ""), ":8080") {
		t.Errorf("liveness probe %+v does not match health %v", p, health)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/ready" ||
		p.HTTPGet.Port.String() != port(t, strings.Join(ready[0], ""), ":8181") {
		t.Errorf("readiness probe %+v does not match ready %v", p, ready)
	}
	if got, want := strconv.Itoa(int(containerPort(t, c, "metrics").ContainerPort)), port(t, prom[0][0], ":9153"); got != want {
		t.Errorf("metrics port %s, prometheus listens on %s", got, want)
	}
	if containerPort(t, c, "dns").ContainerPort != 53 || containerPort(t, c, "dns-tcp").ContainerPort != 53 {
		t.Error("DNS ports are not 53")
	}
	// Clients reach the front end on 53; the block listens on a port of its
	// own for what the front end hands it.
	if fe := frontendAddrs(b); len(fe) != 1 || fe[0] != ":53" {
		t.Errorf("the front end listens on %v, want :53", fe)
	}
	if strings.HasSuffix(b.Keys[0], ":53") {
		t.Errorf("server block %v listens on 53, the front end's port", b.Keys)
	}
	for _, sp := range svc.Spec.Ports {
		if cp := containerPort(t, c, sp.Name); cp.ContainerPort != sp.Port || cp.Protocol != sp.Protocol {
			t.Errorf("Service port %s %d/%s, container %d/%s", sp.Name, sp.Port, sp.Protocol, cp.ContainerPort, cp.Protocol)
		}
	}
	// The upstream's unprivileged-port sysctl, allowed off the host network.
	found := false
	if psc := pod.Spec.SecurityContext; psc != nil {
		for _, s := range psc.Sysctls {
			found = found || s.Name == "net.ipv4.ip_unprivileged_port_start" && s.Value == "53"
		}
	}
	if !found {
		t.Error("no net.ipv4.ip_unprivileged_port_start=53 sysctl")
	}
}

func TestNodeLocalDNS(t *testing.T) {
	ms := decodeStrict(t, filepath.Join("kubernetes", "nodelocaldns.yaml"))
	ds := object[*appsv1.DaemonSet](t, ms, "node-local-dns")
	sa := object[*corev1.ServiceAccount](t, ms, "node-local-dns")
	upstream := object[*corev1.Service](t, ms, "kube-dns-upstream")
	metricsSvc := object[*corev1.Service](t, ms, "node-local-dns")

	pod := ds.Spec.Template
	if !selects(t, ds.Spec.Selector, pod.Labels) {
		t.Error("the DaemonSet's selector does not select its pods")
	}
	if !selects(t, &metav1.LabelSelector{MatchLabels: metricsSvc.Spec.Selector}, pod.Labels) {
		t.Error("the node-local-dns Service does not select the pods")
	}
	if upstream.Spec.Selector["k8s-app"] != "kube-dns" {
		t.Errorf("kube-dns-upstream selects %v, want the cluster DNS pods", upstream.Spec.Selector)
	}
	if pod.Spec.ServiceAccountName != sa.Name {
		t.Errorf("pods run as %q, want %q", pod.Spec.ServiceAccountName, sa.Name)
	}
	if !pod.Spec.HostNetwork || pod.Spec.DNSPolicy != corev1.DNSDefault {
		t.Error("want hostNetwork and dnsPolicy Default")
	}
	if pod.Spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", pod.Spec.PriorityClassName)
	}
	if len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) != 1 {
		t.Fatalf("want one init container and one container")
	}
	c := pod.Spec.Containers[0]
	checkPodSecurity(t, c)
	init := pod.Spec.InitContainers[0]
	if init.SecurityContext == nil || init.SecurityContext.Capabilities == nil ||
		!slices.Contains(init.SecurityContext.Capabilities.Add, "NET_ADMIN") {
		t.Error("the set-up init container needs NET_ADMIN for ip and iptables")
	}

	cmName := configVolume(t, pod.Spec, c)
	cm := object[*corev1.ConfigMap](t, ms, cmName)
	if !strings.Contains(strings.Join(init.Command, " "), "setup.sh") || cm.Data["setup.sh"] == "" {
		t.Errorf("the init container runs %q; the ConfigMap must hold setup.sh", init.Command)
	}
	blocks := corefile(t, cm.Data["Corefile"])
	checkMemory(t, c, blocks)

	const localIP = "169.254.20.10"
	if !strings.Contains(cm.Data["setup.sh"], localIP) {
		t.Errorf("setup.sh does not set up %s", localIP)
	}
	var envIPs string
	for _, e := range init.Env {
		if e.Name == "LOCAL_IPS" {
			envIPs = e.Value
		}
	}
	for _, b := range blocks {
		bind := directiveArgs(b, "bind")
		if len(bind) != 1 || !slices.Contains(bind[0], localIP) {
			t.Errorf("block %v binds %v, want %s", b.Keys, bind, localIP)
		}
		for _, ip := range bind[0] {
			if !strings.Contains(envIPs, ip) {
				t.Errorf("block %v binds %s, which the init container (LOCAL_IPS=%q) does not set up", b.Keys, ip, envIPs)
			}
		}
		if _, ok := b.Tokens["compactcache"]; !ok {
			t.Errorf("block %v has no compactcache", b.Keys)
		}
		// One front end on the node-local address, shared by every block.
		if fe := frontendAddrs(b); len(fe) != 1 || fe[0] != localIP+":53" {
			t.Errorf("block %v: front end on %v, want %s:53", b.Keys, fe, localIP)
		}
		for _, p := range directiveArgs(b, "prometheus") {
			if got := strconv.Itoa(int(containerPort(t, c, "metrics").ContainerPort)); got != port(t, p[0], ":9153") {
				t.Errorf("metrics port %s, prometheus listens on %v", got, p)
			}
		}
		if h := directiveArgs(b, "health"); len(h) > 0 {
			p := c.LivenessProbe
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Host+":"+p.HTTPGet.Port.String() != h[0][0] {
				t.Errorf("liveness probe %+v does not match health %v", p, h)
			}
		}
	}
	if ds.Spec.Template.Spec.SecurityContext != nil && len(ds.Spec.Template.Spec.SecurityContext.Sysctls) > 0 {
		t.Error("a host-network pod may not set sysctls")
	}
}

// TestMemoryMismatchIsCaught makes sure the check fails when the budget
// changes without the limit, or the limit without GOMEMLIMIT.
func TestMemoryMismatchIsCaught(t *testing.T) {
	if got := budgets(t, corefile(t, ".:53 {\n compactcache {\n capacity 512MiB\n }\n}\n")); !slices.Equal(got, []int64{512 * mib}) {
		t.Fatalf("budgets %v", got)
	}
	if got := budgets(t, corefile(t, ".:53 {\n compactcache 30\n}\n")); !slices.Equal(got, []int64{64 * mib}) {
		t.Fatalf("default budget %v, want 64MiB", got)
	}
	two := corefile(t, "a.:53 {\n compactcache {\n capacity 1G\n }\n}\nb.:53 {\n compactcache {\n capacity 2048K\n }\n}\n")
	if got := budgets(t, two); !slices.Equal(got, []int64{1 << 30, 2 * mib}) {
		t.Fatalf("budgets %v", got)
	}

	container := func(limit, request, gomem string) corev1.Container {
		c := corev1.Container{Name: "x", Env: []corev1.EnvVar{{Name: "GOMEMLIMIT", Value: gomem}}}
		c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)}
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(request)}
		return c
	}
	if errs := memoryErrors(container("480Mi", "480Mi", "128MiB"), []int64{256 * mib}); len(errs) != 0 {
		t.Errorf("the documented example fails: %v", errs)
	}
	for _, tc := range []struct {
		c      corev1.Container
		budget int64
	}{
		{container("480Mi", "480Mi", "128MiB"), 512 * mib}, // budget raised alone
		{container("800Mi", "800Mi", "128MiB"), 512 * mib}, // GOMEMLIMIT left behind
		{container("480Mi", "128Mi", "128MiB"), 256 * mib}, // request below the limit
		{container("480Mi", "480Mi", "128Mi"), 256 * mib},  // not a Go size
		{container("480Mi", "480Mi", "384MiB"), 256 * mib}, // the stores counted in GOMEMLIMIT
	} {
		if errs := memoryErrors(tc.c, []int64{tc.budget}); len(errs) == 0 {
			t.Errorf("%+v with %d MiB: no error", tc.c.Resources, tc.budget/mib)
		}
	}
	for _, in := range []string{"384MiB", "402653184", "1GiB"} {
		if _, err := goMemLimit(in); err != nil {
			t.Errorf("goMemLimit(%q): %v", in, err)
		}
	}
}

// TestClusterDNSWarmup checks how the cluster DNS pods warm from their
// peers: the admin endpoint on the container's admin port with the
// Secret's token, the warm-up at the address Kubernetes gives the pods for
// the coredns-peers Service, and a NetworkPolicy that lets only the pods
// themselves reach the admin port while DNS, metrics and the probes stay
// open.
func TestClusterDNSWarmup(t *testing.T) {
	ms := decodeStrict(t, filepath.Join("kubernetes", "coredns.yaml"))
	dep := object[*appsv1.Deployment](t, ms, "coredns")
	peers := object[*corev1.Service](t, ms, "coredns-peers")
	np := object[*networkingv1.NetworkPolicy](t, ms, "coredns-admin")
	pod := dep.Spec.Template
	c := pod.Spec.Containers[0]
	text := object[*corev1.ConfigMap](t, ms, configVolume(t, pod.Spec, c)).Data["Corefile"]
	admin := containerPort(t, c, "admin")

	// admin ADDRESS { token_file PATH } on the container's admin port, not
	// on the loopback: the peers reach it.
	m := regexp.MustCompile(`(?m)^\s*admin (\S+) \{$`).FindStringSubmatch(text)
	if m == nil || !strings.HasPrefix(m[1], ":") || port(t, m[1], "") != strconv.Itoa(int(admin.ContainerPort)) {
		t.Errorf("admin %v, want the pod's addresses on the admin port %d", m, admin.ContainerPort)
	}
	// The Secret's key token, mounted where every token_file points.
	var mount string
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "compactcache-admin" {
			for _, vm := range c.VolumeMounts {
				if vm.Name == v.Name && vm.ReadOnly {
					mount = vm.MountPath
				}
			}
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
				t.Errorf("the token's mode %v lets others read it", v.Secret.DefaultMode)
			}
		}
	}
	psc := pod.Spec.SecurityContext
	if mount == "" || psc == nil || psc.FSGroup == nil || c.SecurityContext.RunAsGroup == nil || *psc.FSGroup != *c.SecurityContext.RunAsGroup {
		t.Error("the Secret compactcache-admin is not mounted read-only where the container's group reads it (fsGroup)")
	}
	tokens := regexp.MustCompile(`(?m)^\s*token_file (\S+)$`).FindAllStringSubmatch(text, -1)
	if len(tokens) != 2 {
		t.Errorf("%d token_file lines, want 2 (admin and warmup)", len(tokens))
	}
	for _, tf := range tokens {
		if tf[1] != mount+"/token" {
			t.Errorf("token_file %s, the Secret's key token is at %s/token", tf[1], mount)
		}
	}

	// A writable /tmp on the node's disk, as large as the stream a fill
	// takes (four times the budget and a MiB), where the warm-up copies
	// it: without one it is held in memory, past the container's limit.
	var tmp *corev1.Volume
	for _, vm := range c.VolumeMounts {
		for i, v := range pod.Spec.Volumes {
			if vm.MountPath == "/tmp" && !vm.ReadOnly && v.Name == vm.Name {
				tmp = &pod.Spec.Volumes[i]
			}
		}
	}
	blocks := corefile(t, text)
	if bs := budgets(t, blocks); tmp == nil || tmp.EmptyDir == nil || tmp.EmptyDir.Medium != corev1.StorageMediumDefault ||
		tmp.EmptyDir.SizeLimit == nil || len(bs) != 1 || tmp.EmptyDir.SizeLimit.Value() < 4*bs[0]+mib {
		t.Errorf("/tmp: %+v, want a writable emptyDir on disk of at least four times the budgets %v MiB and a MiB", tmp, mibs(bs))
	}

	// warmup at the Service's address and port from the pod's environment.
	env := strings.ToUpper(strings.ReplaceAll(peers.Name, "-", "_")) + "_SERVICE_"
	want := "http://{$" + env + "HOST}:{$" + env + "PORT}"
	if m := regexp.MustCompile(`(?m)^\s*warmup (\S+) \{$`).FindStringSubmatch(text); m == nil || m[1] != want {
		t.Errorf("warmup %v, want %s", m, want)
	}
	if peers.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Error("coredns-peers is headless: Kubernetes puts no address of it in the pods' environment")
	}
	if !selects(t, &metav1.LabelSelector{MatchLabels: peers.Spec.Selector}, pod.Labels) {
		t.Error("coredns-peers does not select the pods")
	}
	if len(peers.Spec.Ports) == 0 || (peers.Spec.Ports[0].TargetPort.String() != admin.Name && peers.Spec.Ports[0].TargetPort.IntValue() != int(admin.ContainerPort)) {
		t.Errorf("coredns-peers' first port %+v (the one _SERVICE_PORT names) does not lead to the admin port", peers.Spec.Ports)
	}
	var order []string
	for _, m := range ms {
		order = append(order, m.obj.(metav1.Object).GetName()+" "+fmt.Sprintf("%T", m.obj))
	}
	if slices.Index(order, "coredns-peers *v1.Service") > slices.Index(order, "coredns *v1.Deployment") {
		t.Error("coredns-peers comes after the Deployment: its pods would start without the Service's address")
	}

	// The NetworkPolicy: the admin port from the Deployment's pods only;
	// every other port of the container and the probes from anywhere.
	if !selects(t, &np.Spec.PodSelector, pod.Labels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Fatal("the NetworkPolicy does not isolate the pods' ingress")
	}
	open := map[string]bool{}
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			key := fmt.Sprintf("%d/%s", p.Port.IntValue(), *p.Protocol)
			if p.Port.IntValue() == int(admin.ContainerPort) {
				for _, f := range r.From {
					if f.NamespaceSelector != nil || f.IPBlock != nil || f.PodSelector == nil || !selects(t, f.PodSelector, pod.Labels) || !selects(t, f.PodSelector, map[string]string{"k8s-app": pod.Labels["k8s-app"]}) {
						t.Errorf("the admin port is open to %+v, beyond the Deployment's pods", f)
					}
				}
				if len(r.From) == 0 {
					t.Error("the admin port is open to everyone")
				}
				continue
			}
			if len(r.From) == 0 {
				open[key] = true
			}
		}
	}
	need := []string{fmt.Sprintf("%d/TCP", c.LivenessProbe.HTTPGet.Port.IntValue()), fmt.Sprintf("%d/TCP", c.ReadinessProbe.HTTPGet.Port.IntValue())}
	for _, p := range c.Ports {
		if p.Name != admin.Name {
			need = append(need, fmt.Sprintf("%d/%s", p.ContainerPort, p.Protocol))
		}
	}
	for _, k := range need {
		if !open[k] {
			t.Errorf("the NetworkPolicy closes %s, which was open before it", k)
		}
	}
}

// TestNodeLocalWatchOptIn: a node-local block that opts in to a watch of
// its own reaches the API server as the pod's service account (no
// kubeconfig or endpoint), so the pod needs that account's token and the
// account list and watch on Services and EndpointSlices. The manifest's
// blocks that opt in get them; deploy/README.md's opt-in names all three,
// since the DaemonSet leaves the token out for the blocks that do not.
func TestNodeLocalWatchOptIn(t *testing.T) {
	ms := decodeStrict(t, filepath.Join("kubernetes", "nodelocaldns.yaml"))
	ds := object[*appsv1.DaemonSet](t, ms, "node-local-dns")
	spec := ds.Spec.Template.Spec
	tokenMounted := spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken
	cm := object[*corev1.ConfigMap](t, ms, configVolume(t, spec, spec.Containers[0]))
	for _, b := range corefile(t, cm.Data["Corefile"]) {
		toks := b.Tokens["compactcache"]
		for i, tok := range toks {
			if tok.Text != "kubernetes" || i+1 >= len(toks) || toks[i+1].Line != tok.Line {
				continue // the option alone follows a kubernetes plugin: no watch of its own
			}
			if !tokenMounted {
				t.Errorf("block %v watches the API server as the pod's service account, whose token the pod does not mount", b.Keys)
			}
		}
	}

	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var para string
	for _, p := range strings.Split(string(data), "\n\n") {
		if strings.Contains(p, "opt in to a watch of") {
			para = strings.Join(strings.Fields(p), " ")
		}
	}
	if para == "" {
		t.Fatal("deploy/README.md no longer says how a node-local block opts in to a watch of its own")
	}
	need := []string{"`services`", "`endpointslices.discovery.k8s.io`", "`" + ds.Spec.Template.Spec.ServiceAccountName + "`"}
	if !tokenMounted {
		need = append(need, "`automountServiceAccountToken: true`")
	}
	for _, n := range need {
		if !strings.Contains(para, n) {
			t.Errorf("deploy/README.md's opt-in to a node-local watch does not name %s: %s", n, para)
		}
	}
}
