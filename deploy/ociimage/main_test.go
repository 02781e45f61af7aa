package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// setcapBytes is what `setcap cap_net_bind_service=+ep FILE` writes as the
// security.capability attribute (read back with os.getxattr on Debian 12).
const setcapBytes = "0100000200040000000000000000000000000000"

// dummyBinary builds a tiny static program that prints its first argument.
func dummyBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() { fmt.Println(\"dummy\", os.Args[1:]) }\n"
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module dummy\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "dummy")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH, "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build dummy: %v\n%s", err, out)
	}
	return bin
}

func TestImageLayout(t *testing.T) {
	bin := dummyBinary(t)
	binData, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(certs, []byte("-----BEGIN CERTIFICATE-----\ndummy\n-----END CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)
	out := filepath.Join(t.TempDir(), "oci")
	opts := Options{
		Out: out, Binary: bin, CtlBinary: bin, Platforms: []string{"linux/" + runtime.GOARCH}, Tag: "test",
		CACerts: certs, Setcap: true, Created: created, Revision: "0123456789abcdef",
	}
	if err := Run(context.Background(), opts); err != nil {
		t.Fatal(err)
	}

	for _, f := range []string{"oci-layout", "index.json", "blobs/sha256"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("layout lacks %s: %v", f, err)
		}
	}
	p, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("index does not validate: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %q, want %q", im.MediaType, types.OCIImageIndex)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %q, want %q", desc.MediaType, types.OCIManifestSchema1)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != runtime.GOARCH {
		t.Errorf("platform %+v, want linux/%s", desc.Platform, runtime.GOARCH)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != "test" {
		t.Errorf("ref.name %q, want test", got)
	}

	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("config media type %q", m.Config.MediaType)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != types.OCILayer {
		t.Fatalf("layers %+v, want one %s", m.Layers, types.OCILayer)
	}

	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{"/coredns"}) {
		t.Errorf("Entrypoint %q", cfg.Config.Entrypoint)
	}
	if len(cfg.Config.Cmd) != 0 {
		t.Errorf("Cmd %q, want none (the Deployment gives -conf)", cfg.Config.Cmd)
	}
	var ports []string
	for p := range cfg.Config.ExposedPorts {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	if !slices.Equal(ports, []string{"53/tcp", "53/udp", "9153/tcp"}) {
		t.Errorf("ExposedPorts %q", ports)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("User %q, want 65532:65532", cfg.Config.User)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("config platform %s/%s", cfg.OS, cfg.Architecture)
	}
	if !cfg.Created.Time.Equal(created) {
		t.Errorf("created %v, want %v", cfg.Created.Time, created)
	}
	if got := cfg.Config.Labels["org.opencontainers.image.revision"]; got != opts.Revision {
		t.Errorf("revision label %q", got)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]*tar.Header{}
	var extracted string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = h
		if h.Name == "coredns" {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(data, binData) {
				t.Errorf("/coredns differs from the binary given")
			}
			extracted = filepath.Join(t.TempDir(), "coredns")
			if err := os.WriteFile(extracted, data, os.FileMode(h.Mode)); err != nil {
				t.Fatal(err)
			}
		}
	}
	h := files["coredns"]
	if h == nil {
		t.Fatalf("layer has no /coredns; it has %v", files)
	}
	if h.Typeflag != tar.TypeReg || h.Mode != 0o755 || h.Uid != 65532 || h.Gid != 65532 {
		t.Errorf("/coredns: type %c mode %o owner %d:%d, want a file 0755 65532:65532", h.Typeflag, h.Mode, h.Uid, h.Gid)
	}
	if got := hex.EncodeToString([]byte(h.PAXRecords["SCHILY.xattr.security.capability"])); got != setcapBytes {
		t.Errorf("security.capability %s, want %s (setcap cap_net_bind_service=+ep)", got, setcapBytes)
	}
	if !h.ModTime.Equal(created) {
		t.Errorf("/coredns mtime %v, want %v", h.ModTime, created)
	}
	if c := files["compactcache-ctl"]; c == nil || c.Typeflag != tar.TypeReg || c.Mode != 0o755 || c.Uid != 65532 || c.Gid != 65532 || len(c.PAXRecords) != 0 || c.Size != int64(len(binData)) {
		t.Errorf("/compactcache-ctl: %+v, want the binary given, 0755 65532:65532, no capability", c)
	}
	if c := files["etc/ssl/certs/ca-certificates.crt"]; c == nil || c.Mode != 0o644 {
		t.Errorf("CA bundle: %+v, want etc/ssl/certs/ca-certificates.crt 0644", c)
	}
	for _, d := range []string{"etc/", "etc/ssl/", "etc/ssl/certs/"} {
		if files[d] == nil || files[d].Typeflag != tar.TypeDir {
			t.Errorf("layer lacks directory %s", d)
		}
	}

	// The binary as the image holds it runs (it is static and executable).
	if runtime.GOOS == "linux" {
		out, err := exec.Command(extracted, "-conf", "x").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "dummy [-conf x]") {
			t.Errorf("extracted binary: %v: %s", err, out)
		}
	}

	// The same inputs give the same digest, and -o replaces a layout.
	d1, _ := idx.Digest()
	if err := Run(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	p2, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	idx2, err := p2.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	if d2, _ := idx2.Digest(); d1 != d2 {
		t.Errorf("rebuilt index digest %s, first %s: not reproducible", d2, d1)
	}
	blobs, _ := os.ReadDir(filepath.Join(out, "blobs", "sha256"))
	if len(blobs) != 3 {
		t.Errorf("%d blobs after a rebuild, want 3 (manifest, config, layer)", len(blobs))
	}
}

func TestNoCapabilityNoCerts(t *testing.T) {
	layerTar, err := Layer([]byte("bin"), nil, nil, false, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(layerTar))
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
		if len(h.PAXRecords) != 0 {
			t.Errorf("%s has PAX records %v with -setcap=false", h.Name, h.PAXRecords)
		}
	}
	if !slices.Equal(names, []string{"coredns"}) {
		t.Errorf("layer holds %q, want only coredns", names)
	}
}

func TestRefuses(t *testing.T) {
	plat := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if err := checkStatic([]byte("#!/bin/sh\n"), plat); err == nil {
		t.Error("a shell script was accepted")
	}
	if runtime.GOOS == "linux" {
		// Debian's coreutils are dynamically linked.
		if data, err := os.ReadFile("/bin/true"); err == nil {
			if err := checkStatic(data, plat); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
				t.Errorf("/bin/true: %v, want refused as dynamically linked", err)
			}
		}
	}
	other := v1.Platform{OS: "linux", Architecture: "arm64"}
	if runtime.GOARCH == "arm64" {
		other.Architecture = "amd64"
	}
	data, err := os.ReadFile(dummyBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkStatic(data, plat); err != nil {
		t.Errorf("static dummy refused: %v", err)
	}
	if err := checkStatic(data, other); err == nil {
		t.Errorf("a %s binary was accepted for %s", runtime.GOARCH, other.Architecture)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "precious"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := clearLayout(dir); err == nil {
		t.Error("clearLayout would remove a directory that is not an OCI layout")
	}
	if err := Run(context.Background(), Options{Out: t.TempDir(), Binary: "x", Platforms: []string{"linux/amd64", "linux/arm64"}}); err == nil {
		t.Error("-binary with two platforms was accepted")
	}
}
