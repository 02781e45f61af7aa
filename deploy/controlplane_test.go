package deploy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/compactcache/compactcache/internal/testenv"
)

// A real control plane on the loopback: etcd (Debian's etcd-server) and
// kube-apiserver and kubectl built from k8s.io/kubernetes by
// apiserver/run.sh, with certificates made here for the one run. No
// controller manager, scheduler or kubelet: objects are stored and served,
// nothing runs them, so the tests write the EndpointSlices the controller
// would.

// serviceCIDRs are the cluster's Service ranges, dual-stack so that a
// Service gets an AAAA record; CLUSTER_DNS_IP is taken from the first.
const (
	serviceCIDRs = "10.96.0.0/16,fd00:10:96::/112"
	clusterDNSIP = "10.96.0.10"
)

type controlPlane struct {
	dir        string
	url        string // https://127.0.0.1:PORT
	kubeconfig string // the administrator's (system:masters)
	kubectlBin string
	caPEM      []byte
	apiserver  *instance // stopped by a test of a lost API server
}

// apiserverCacheDir is where apiserver/run.sh builds kube-apiserver and
// kubectl: a directory of the user's cache named for the go.mod and go.sum
// it builds from, so that a change of version builds again.
func apiserverCacheDir(t testing.TB) string {
	t.Helper()
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join("apiserver", f))
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Skipf("no cache directory for the kube-apiserver build: %v", err)
	}
	return filepath.Join(cache, "compactcache-apiserver", hex.EncodeToString(h.Sum(nil))[:12])
}

// controlPlaneBinaries finds etcd, kube-apiserver and kubectl, or skips the
// test saying how to get them; with COMPACTCACHE_CONTROL_PLANE=required
// (.ci/run, which gets them) it fails instead, so that CI never passes
// without the control plane's tests.
func controlPlaneBinaries(t testing.TB) (etcd, apiserver, kubectl string) {
	t.Helper()
	unavailable := t.Skipf
	if os.Getenv("COMPACTCACHE_CONTROL_PLANE") == "required" {
		unavailable = t.Fatalf
	}
	if testing.Short() {
		unavailable("starts etcd and kube-apiserver; not in -short")
	}
	dir := apiserverCacheDir(t)
	apiserver, kubectl = filepath.Join(dir, "kube-apiserver"), filepath.Join(dir, "kubectl")
	if p := os.Getenv("KUBE_APISERVER"); p != "" {
		apiserver = p
	}
	if p := os.Getenv("KUBECTL"); p != "" {
		kubectl = p
	}
	for _, p := range []string{apiserver, kubectl} {
		if _, err := os.Stat(p); err != nil {
			unavailable("control plane not available: %s is not built; deploy/apiserver/run.sh builds kube-apiserver and kubectl (about 5 minutes cold on 2 cores) and runs this test", p)
		}
	}
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		unavailable("control plane not available: no etcd on PATH; apt-get install etcd-server (deploy/apiserver/run.sh does)")
	}
	return etcd, apiserver, kubectl
}

func startControlPlane(t testing.TB) *controlPlane {
	t.Helper()
	etcdBin, apiserverBin, kubectlBin := controlPlaneBinaries(t)
	dir := t.TempDir()
	cp := &controlPlane{dir: dir, kubectlBin: kubectlBin}

	ca, caKey := newCA(t)
	cp.caPEM = pemBlock("CERTIFICATE", ca.Raw)
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.crt", cp.caPEM)
	serving, servingKey := newCert(t, ca, caKey, pkix.Name{CommonName: "kube-apiserver"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP("10.96.0.1")}, []string{"localhost", "kubernetes.default.svc"}, x509.ExtKeyUsageServerAuth)
	admin, adminKey := newCert(t, ca, caKey, pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}}, nil, nil, x509.ExtKeyUsageClientAuth)
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	saPub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	saPriv, _ := x509.MarshalPKCS8PrivateKey(saKey)

	etcdClient, etcdPeer := testenv.FreePort(t), testenv.FreePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	daemon(t, "etcd", etcdBin, "--name", "test", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "test="+peerURL, "--log-level", "warn")

	port := testenv.FreePort(t)
	cp.url = fmt.Sprintf("https://127.0.0.1:%d", port)
	apiserver := daemon(t, "kube-apiserver", apiserverBin,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", fmt.Sprint(port),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--tls-cert-file", write("apiserver.crt", pemBlock("CERTIFICATE", serving.Raw)),
		"--tls-private-key-file", write("apiserver.key", pemBlock("PRIVATE KEY", servingKey)),
		"--client-ca-file", caFile,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", write("sa.pub", pemBlock("PUBLIC KEY", saPub)),
		"--service-account-signing-key-file", write("sa.key", pemBlock("PRIVATE KEY", saPriv)),
		"--service-cluster-ip-range", serviceCIDRs,
		"--authorization-mode", "RBAC",
		// The reconciler that keeps the kubernetes Service's endpoints
		// refuses a loopback address.
		"--endpoint-reconciler-type", "none",
		"--profiling=false")

	cp.kubeconfig = write("admin.kubeconfig", kubeconfig(cp.url, cp.caPEM,
		fmt.Sprintf("client-certificate-data: %s\n    client-key-data: %s", b64(pemBlock("CERTIFICATE", admin.Raw)), b64(pemBlock("PRIVATE KEY", adminKey)))))

	// Ready once /readyz says so: etcd reached, the bootstrap objects
	// (namespaces, the default PriorityClasses, RBAC roles) written.
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	cert, err := tls.X509KeyPair(pemBlock("CERTIFICATE", admin.Raw), pemBlock("PRIVATE KEY", adminKey))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	begin := time.Now()
	last := ""
	for time.Since(begin) < 90*time.Second {
		select {
		case <-apiserver.exited:
			t.Fatalf("kube-apiserver exited: %v", apiserver.err)
		default:
		}
		resp, err := client.Get(cp.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Logf("kube-apiserver ready after %v", time.Since(begin).Round(100*time.Millisecond))
				cp.apiserver = apiserver
				return cp
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("kube-apiserver not ready after 90s: %s", last)
	return nil
}

// daemon starts a server of the control plane; see run.
func daemon(t testing.TB, name, bin string, args ...string) *instance {
	t.Helper()
	return run(t, name, 8000, exec.Command(bin, args...))
}

// kubectl runs kubectl as the administrator with stdin and fails the test
// on an error.
func (cp *controlPlane) kubectl(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := cp.tryKubectl(stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (cp *controlPlane) tryKubectl(stdin string, args ...string) (string, error) {
	cmd := exec.Command(cp.kubectlBin, append([]string{"--kubeconfig", cp.kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates as the
// service account ns/name with a token the API server issues, as the
// kubernetes plugin does in a pod from the token Kubernetes mounts.
func (cp *controlPlane) serviceAccountKubeconfig(t testing.TB, ns, name string) string {
	t.Helper()
	token := strings.TrimSpace(cp.kubectl(t, "", "-n", ns, "create", "token", name, "--duration", "1h"))
	p := filepath.Join(cp.dir, ns+"-"+name+".kubeconfig")
	if err := os.WriteFile(p, kubeconfig(cp.url, cp.caPEM, "token: "+token), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func kubeconfig(server string, caPEM []byte, user string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: test
  user:
    %s
contexts:
- name: test
  context:
    cluster: test
    user: test
current-context: test
`, server, b64(caPEM), user)
}

func newCA(t testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "compactcache test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

// newCert returns a certificate signed by ca and its key in PKCS #8.
func newCert(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, subject pkix.Name, ips []net.IP, names []string, usage x509.ExtKeyUsage) (*x509.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     names,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return cert, pkcs8
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
