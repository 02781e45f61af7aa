package deploy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
	"github.com/miekg/dns"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// sharedLine is the `shared` option deploy/README.md ("Shared tier") has
// the Corefile of coredns.yaml add to its compactcache block.
const sharedLine = `shared redis://compactcache@{$DNS_SHARED_TIER_SERVICE_HOST}:{$DNS_SHARED_TIER_SERVICE_PORT} {
                secret_file /etc/compactcache-shared/secret
                password_file /etc/compactcache-shared/password
            }`

// TestSharedTierManifest: the tier's Service and NetworkPolicy select its
// pods, the policy lets the cluster DNS pods in and no one else, and the
// cluster DNS Deployment mounts the Secret where the deploy/README.md Corefile
// line reads it, optionally, so that it starts without a shared tier.
func TestSharedTierManifest(t *testing.T) {
	ms := decodeStrict(t, filepath.Join("kubernetes", "shared-tier.yaml"))
	d := object[*appsv1.Deployment](t, ms, "dns-shared-tier")
	pod := d.Spec.Template.Labels
	if svc := object[*corev1.Service](t, ms, "dns-shared-tier"); !selectsMap(svc.Spec.Selector, pod) || svc.Spec.Ports[0].Port != 6379 {
		t.Errorf("the Service %v does not send 6379 to the tier's pods %v", svc.Spec, pod)
	}
	np := object[*networkingv1.NetworkPolicy](t, ms, "dns-shared-tier")
	if !selects(t, &np.Spec.PodSelector, pod) || len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 ||
		!selects(t, np.Spec.Ingress[0].From[0].PodSelector, map[string]string{"k8s-app": "kube-dns"}) ||
		selects(t, np.Spec.Ingress[0].From[0].PodSelector, map[string]string{"app": "other"}) {
		t.Errorf("the NetworkPolicy %+v does not let exactly the cluster DNS pods in", np.Spec)
	}
	dns := object[*appsv1.Deployment](t, decodeStrict(t, filepath.Join("kubernetes", "coredns.yaml")), "coredns")
	var vol *corev1.Volume
	for i, v := range dns.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "compactcache-shared" {
			vol = &dns.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.Secret.Optional == nil || !*vol.Secret.Optional {
		t.Fatalf("the cluster DNS pods do not mount the Secret compactcache-shared optionally: %+v", vol)
	}
	mounted := false
	for _, m := range dns.Spec.Template.Spec.Containers[0].VolumeMounts {
		mounted = mounted || m.Name == vol.Name && m.MountPath == "/etc/compactcache-shared"
	}
	if !mounted {
		t.Error("the Secret is not mounted at /etc/compactcache-shared")
	}
}

func selectsMap(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// TestSharedTierServes: two cluster DNS pods, the built binary with the
// README's `shared` line, sharing a redis-server that has the ACL the
// tier's manifest gives Valkey: what one pod fetched, the other serves
// without asking the upstream.
func TestSharedTierServes(t *testing.T) {
	bin := corednsBinary(t)
	ms := decodeStrict(t, filepath.Join("kubernetes", "shared-tier.yaml"))
	args := object[*appsv1.Deployment](t, ms, "dns-shared-tier").Spec.Template.Spec.Containers[0].Args
	const password = "shared-test-password"
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "$(SHARED_PASSWORD)", password)
	}
	r := testenv.StartRedis(t, args...)
	r.Auth("compactcache", password)
	dir := t.TempDir()
	for name, v := range map[string]string{"secret": "0123456789abcdef-shared-test", "password": password} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	host, port, _ := net.SplitHostPort(r.Addr)
	up := startUpstream(t)
	var servers []string
	for range 2 {
		p := testenv.FreePort(t)
		cf := fmt.Sprintf(".:%d {\n    bind 127.0.0.1\n    compactcache 30 {\n            %s\n    }\n    forward . %s\n}\n",
			p, strings.ReplaceAll(sharedLine, "/etc/compactcache-shared", dir), up.addr)
		in := start(t, bin, cf, "DNS_SHARED_TIER_SERVICE_HOST="+host, "DNS_SHARED_TIER_SERVICE_PORT="+port)
		waitOutput(t, in, "Shared tier redis://"+r.Addr+": connected", 20*time.Second)
		servers = append(servers, fmt.Sprintf("127.0.0.1:%d", p))
	}
	wantA(t, query(t, servers[0], "udp", "www.example.org", dns.TypeA), "192.0.2.53", 30)
	for deadline := time.Now().Add(5 * time.Second); r.MustDo("DBSIZE") == ":0"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first pod wrote nothing to the tier")
		}
	}
	wantA(t, query(t, servers[1], "udp", "www.example.org", dns.TypeA), "192.0.2.53", 30)
	if n := up.count("www.example.org.", dns.TypeA); n != 1 {
		t.Errorf("the upstream was asked %d times by two pods sharing a tier, want once", n)
	}
}
