package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestNodeSetupScript runs the init container's setup.sh twice, then its
// teardown, in a network namespace of its own (unshare --net), and checks the
// interface, the address and the iptables rules it leaves. It needs root,
// unshare, ip and iptables; it is skipped without them (Debian: apt-get
// install iptables).
func TestNodeSetupScript(t *testing.T) {
	ms := decodeStrict(t, filepath.Join("kubernetes", "nodelocaldns.yaml"))
	script := object[*corev1.ConfigMap](t, ms, "node-local-dns").Data["setup.sh"]
	if !strings.HasPrefix(script, "#!/bin/sh\n") {
		t.Fatal("setup.sh does not start with #!/bin/sh")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "setup.sh")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-n", path).CombinedOutput(); err != nil {
		t.Fatalf("sh -n setup.sh: %v\n%s", err, out)
	}

	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("running setup.sh needs root on Linux")
	}
	for _, tool := range []string{"unshare", "ip", "iptables", "iptables-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("running setup.sh needs %s", tool)
		}
	}
	if out, err := exec.Command("unshare", "--net", "iptables", "-w", "-t", "raw", "-S").CombinedOutput(); err != nil {
		t.Skipf("no iptables in a new network namespace here: %v: %s", err, out)
	}
	// Kernels without the dummy driver (some sandboxes) cannot create the
	// interface; the rest of the script is tried on a veth of the same name,
	// which the script then finds and keeps.
	precreate := ""
	if out, err := exec.Command("unshare", "--net", "ip", "link", "add", "probe", "type", "dummy").CombinedOutput(); err != nil {
		t.Logf("no dummy interfaces here (%s): the test creates nodelocaldns as a veth", strings.TrimSpace(string(out)))
		precreate = "ip link add nodelocaldns type veth peer name nldpeer\n"
	}

	// One shell in one namespace: set up twice, show, tear down, show.
	steps := precreate + `
set -e
LOCAL_IPS="169.254.20.10 10.96.0.10" sh ` + path + `
LOCAL_IPS="169.254.20.10 10.96.0.10" sh ` + path + `
echo "== addr"
ip -o -4 addr show dev nodelocaldns
echo "== rules"
iptables-save -t raw
iptables-save -t filter
LOCAL_IPS="169.254.20.10 10.96.0.10" sh ` + path + ` teardown
echo "== after teardown"
iptables-save -t raw
iptables-save -t filter
ip link show nodelocaldns 2>/dev/null || echo "no interface"
`
	out, err := exec.Command("unshare", "--net", "sh", "-c", steps).CombinedOutput()
	if err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, out)
	}
	text := string(out)
	parts := strings.SplitN(text, "== after teardown", 2)
	if len(parts) != 2 {
		t.Fatalf("unexpected output:\n%s", text)
	}
	setup, after := parts[0], parts[1]
	for _, ip := range []string{"169.254.20.10", "10.96.0.10"} {
		if !strings.Contains(setup, "inet "+ip+"/32") {
			t.Errorf("nodelocaldns lacks %s/32:\n%s", ip, setup)
		}
		// Five rules per protocol per address, plus two for the health port,
		// each once although the script ran twice.
		for _, rule := range []string{
			"-A PREROUTING -d " + ip + "/32 -p udp -m udp --dport 53 -j NOTRACK",
			"-A PREROUTING -d " + ip + "/32 -p tcp -m tcp --dport 53 -j NOTRACK",
			"-A OUTPUT -d " + ip + "/32 -p udp -m udp --dport 53 -j NOTRACK",
			"-A OUTPUT -s " + ip + "/32 -p tcp -m tcp --sport 53 -j NOTRACK",
			"-A INPUT -d " + ip + "/32 -p udp -m udp --dport 53 -j ACCEPT",
			"-A OUTPUT -s " + ip + "/32 -p tcp -m tcp --sport 53 -j ACCEPT",
			"-A OUTPUT -d " + ip + "/32 -p tcp -m tcp --dport 8080 -j NOTRACK",
		} {
			if n := strings.Count(setup, rule+"\n"); n != 1 {
				t.Errorf("rule %q %d times, want once", rule, n)
			}
		}
	}
	if n := strings.Count(setup, "-j NOTRACK"); n != 2*(2*3+2) {
		t.Errorf("%d NOTRACK rules, want %d", n, 2*(2*3+2))
	}
	if n := strings.Count(setup, "-j ACCEPT"); n != 2*2*2 {
		t.Errorf("%d ACCEPT rules, want %d", n, 2*2*2)
	}
	if strings.Contains(after, "-A ") || !strings.Contains(after, "no interface") {
		t.Errorf("teardown left rules or the interface:\n%s", after)
	}
	if t.Failed() {
		t.Logf("output:\n%s", text)
	}
}
