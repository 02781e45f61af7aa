// Command ociimage writes the custom CoreDNS build as an OCI image layout,
// without a Docker daemon and without a base image from a registry.
//
// It builds ./cmd/coredns statically (CGO_ENABLED=0) for each platform asked
// for, or takes a binary already built, checks that the binary is a static
// Linux ELF of the right architecture, and writes a directory holding
// oci-layout, index.json and blobs/sha256/: one image per platform, each of
// one layer with /coredns (mode 0755, owned by 65532:65532, with the file
// capability cap_net_bind_service=+ep as the Dockerfile's setcap gives it),
// /compactcache-ctl, the admin endpoint's tool (0755, 65532:65532, built
// from ./cmd/compactcache-ctl, or -ctl-binary beside -binary) and, unless
// -cacerts is empty, /etc/ssl/certs/ca-certificates.crt, as the upstream
// CoreDNS image has. The config matches the upstream image's and
// deploy/Dockerfile's: Entrypoint ["/coredns"], ports 53/udp, 53/tcp and
// 9153/tcp, user 65532:65532.
//
// Run it from the repository:
//
//	go run ./deploy/ociimage -o coredns-oci -tag v1.15.0-compactcache
//	go run ./deploy/ociimage -platform linux/amd64,linux/arm64 -o coredns-oci
//	go run ./deploy/ociimage -binary ./coredns -o coredns-oci
//
// The output is reproducible: file times and the image's creation time come
// from SOURCE_DATE_EPOCH, or else from the time of the commit built (git), or
// else from the commit time recorded in a -binary, or else the Unix epoch;
// never from the clock. Push it with crane or skopeo (see deploy/README.md).
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed shape, shared with deploy/Dockerfile and the manifests.
const (
	// UID and GID the binary runs as: distroless's "nonroot".
	UID = 65532
	GID = 65532
	// Entrypoint is the binary's path in the image, as in the upstream image.
	Entrypoint = "/coredns"
	// CtlPath is where the admin endpoint's tool goes, for kubectl exec.
	CtlPath = "/compactcache-ctl"
	// CACertsPath is where the upstream image keeps the CA bundle.
	CACertsPath = "/etc/ssl/certs/ca-certificates.crt"
)

// ExposedPorts are the upstream image's ports plus the metrics port.
var ExposedPorts = []string{"53/tcp", "53/udp", "9153/tcp"}

// capNetBindService is the value of the security.capability extended
// attribute that `setcap cap_net_bind_service=+ep` writes: struct
// vfs_cap_data, revision 2 (linux/capability.h), little-endian. The
// effective bit makes the kernel raise the capability at exec for a non-root
// user, as long as the container's bounding set holds it.
var capNetBindService = func() []byte {
	const (
		vfsCapRevision2    = 0x02000000
		vfsCapFlagsEffectv = 0x000001
		capNetBindService  = 10
	)
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], vfsCapRevision2|vfsCapFlagsEffectv)
	binary.LittleEndian.PutUint32(b[4:], 1<<capNetBindService) // permitted, low word
	// inheritable low word, permitted and inheritable high words: zero.
	return b
}()

// xattrCapability is the PAX record name under which tar (and containerd's
// and Docker's unpackers) carry the attribute.
const xattrCapability = "SCHILY.xattr.security.capability"

// Options says what to build and where.
type Options struct {
	Out        string    // output directory (the OCI layout)
	Binary     string    // a built binary; empty: build Package
	Package    string    // the package to build, relative to the module root
	CtlBinary  string    // a built compactcache-ctl; empty: build CtlPackage, or with Binary none
	CtlPackage string    // the tool's package, relative to the module root; empty: none
	ModuleDir  string    // where to run go build; empty: the current module
	Platforms  []string  // os/arch pairs, e.g. linux/amd64
	Tag        string    // org.opencontainers.image.ref.name of every manifest
	CACerts    string    // the CA bundle to ship; empty: none
	Setcap     bool      // give /coredns cap_net_bind_service=+ep
	Created    time.Time // zero: see creationTime
	Revision   string    // the source commit; empty: see Run
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("ociimage: ")
	opts := Options{Setcap: true, CtlPackage: "./cmd/compactcache-ctl"}
	var platforms string
	flag.StringVar(&opts.Out, "o", "coredns-oci", "output `directory`: the OCI image layout (replaced if it already is one)")
	flag.StringVar(&opts.Binary, "binary", "", "a static linux `binary` to package instead of building -pkg (one platform only)")
	flag.StringVar(&opts.Package, "pkg", "./cmd/coredns", "the `package` to build, relative to the module root")
	flag.StringVar(&opts.CtlBinary, "ctl-binary", "", "a static linux compactcache-ctl `binary` to ship beside -binary (without -binary the tool is built)")
	flag.StringVar(&opts.ModuleDir, "C", "", "the module root `dir` to build in (default: the module of the current directory)")
	flag.StringVar(&platforms, "platform", "linux/"+runtime.GOARCH, "comma-separated `os/arch` list; several make a multi-platform index")
	flag.StringVar(&opts.Tag, "tag", "latest", "the `tag` recorded as org.opencontainers.image.ref.name")
	flag.StringVar(&opts.CACerts, "cacerts", "/etc/ssl/certs/ca-certificates.crt", "CA bundle `file` to ship at "+CACertsPath+"; empty: none")
	flag.BoolVar(&opts.Setcap, "setcap", true, "give /coredns the file capability cap_net_bind_service=+ep")
	flag.Parse()
	if flag.NArg() > 0 {
		log.Fatalf("unexpected arguments %q", flag.Args())
	}
	opts.Platforms = strings.Split(platforms, ",")
	if err := Run(context.Background(), opts); err != nil {
		log.Fatal(err)
	}
}

// Run builds or reads the binaries and writes the layout to opts.Out.
func Run(ctx context.Context, opts Options) error {
	if opts.Binary != "" && len(opts.Platforms) != 1 {
		return errors.New("-binary packages one binary: give one -platform")
	}
	var certs []byte
	if opts.CACerts != "" {
		var err error
		if certs, err = os.ReadFile(opts.CACerts); err != nil {
			return fmt.Errorf("-cacerts: %w (give -cacerts '' to ship none)", err)
		}
	}
	if opts.Binary == "" && opts.Revision == "" {
		opts.Revision = git(ctx, opts.ModuleDir, "rev-parse", "HEAD")
	}
	if opts.Binary == "" && opts.Created.IsZero() && os.Getenv("SOURCE_DATE_EPOCH") == "" {
		if n, err := strconv.ParseInt(git(ctx, opts.ModuleDir, "log", "-1", "--format=%ct"), 10, 64); err == nil {
			opts.Created = time.Unix(n, 0).UTC()
		}
	}
	tmp, err := os.MkdirTemp("", "ociimage")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range opts.Platforms {
		plat, err := v1.ParsePlatform(strings.TrimSpace(p))
		if err != nil {
			return fmt.Errorf("-platform %q: %w", p, err)
		}
		if plat.OS != "linux" {
			return fmt.Errorf("-platform %q: only linux images are built", p)
		}
		bin, ctl := opts.Binary, opts.CtlBinary
		if bin == "" {
			bin = filepath.Join(tmp, "coredns-"+plat.OS+"-"+plat.Architecture)
			if err := buildBinary(ctx, opts.ModuleDir, opts.Package, opts.Revision, *plat, bin); err != nil {
				return err
			}
			if ctl == "" && opts.CtlPackage != "" {
				ctl = filepath.Join(tmp, "compactcache-ctl-"+plat.OS+"-"+plat.Architecture)
				if err := buildBinary(ctx, opts.ModuleDir, opts.CtlPackage, "", *plat, ctl); err != nil {
					return err
				}
			}
		}
		img, err := Image(bin, ctl, *plat, certs, opts)
		if err != nil {
			return fmt.Errorf("%s: %w", bin, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: img,
			Descriptor: v1.Descriptor{
				Platform:    plat,
				Annotations: map[string]string{"org.opencontainers.image.ref.name": opts.Tag},
			},
		})
	}
	if err := clearLayout(opts.Out); err != nil {
		return err
	}
	if _, err := layout.Write(opts.Out, idx); err != nil {
		return fmt.Errorf("writing %s: %w", opts.Out, err)
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s (index %s, tag %s, %s)\n", opts.Out, digest, opts.Tag, strings.Join(opts.Platforms, ", "))
	return nil
}

// clearLayout makes room for a new layout at dir: it may not exist, be
// empty, or be an OCI layout (which is removed), but nothing else, so that a
// mistyped -o never deletes a directory of other files.
func clearLayout(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(entries) == 0 {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
		return fmt.Errorf("-o %s: not empty and not an OCI layout; not replacing it", dir)
	}
	return os.RemoveAll(dir)
}

// buildBinary builds pkg statically for plat into out.
func buildBinary(ctx context.Context, moduleDir, pkg, revision string, plat v1.Platform, out string) error {
	ldflags := "-s -w"
	if len(revision) >= 7 {
		// The commit in `coredns -version`, as the upstream Makefile stamps it.
		ldflags += " -X github.com/coredns/coredns/coremain.GitCommit=" + revision[:7]
	}
	args := []string{"build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+plat.OS, "GOARCH="+plat.Architecture)
	if plat.Architecture == "arm" && plat.Variant != "" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(plat.Variant, "v"))
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	log.Printf("CGO_ENABLED=0 GOOS=%s GOARCH=%s go %s", plat.OS, plat.Architecture, strings.Join(args, " "))
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s for %s/%s: %w", pkg, plat.OS, plat.Architecture, err)
	}
	return nil
}

// git returns the trimmed output of a git command in dir, or "" when git or
// the repository is not there.
func git(ctx context.Context, dir string, args ...string) string {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Image builds the one-layer image of the binary at bin for plat, with the
// tool at ctl ("": none).
func Image(bin, ctl string, plat v1.Platform, certs []byte, opts Options) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	if err := checkStatic(data, plat); err != nil {
		return nil, err
	}
	var ctlData []byte
	if ctl != "" {
		if ctlData, err = os.ReadFile(ctl); err != nil {
			return nil, err
		}
		if err := checkStatic(ctlData, plat); err != nil {
			return nil, fmt.Errorf("%s: %w", ctl, err)
		}
	}
	created := opts.Created
	if created.IsZero() {
		created = creationTime(bin)
	}
	layerTar, err := Layer(data, ctlData, certs, opts.Setcap, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}

	labels := map[string]string{
		"org.opencontainers.image.title":       "coredns-compactcache",
		"org.opencontainers.image.description": "CoreDNS with the compactcache plugin",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	if opts.Revision != "" {
		labels["org.opencontainers.image.revision"] = opts.Revision
	}
	if info, err := buildinfo.ReadFile(bin); err == nil {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && opts.Revision == "" {
				labels["org.opencontainers.image.revision"] = s.Value
			}
		}
		for _, d := range info.Deps {
			if d.Path == "github.com/coredns/coredns" {
				labels["org.opencontainers.image.version"] = d.Version
			}
		}
	}
	ports := map[string]struct{}{}
	for _, p := range ExposedPorts {
		ports[p] = struct{}{}
	}
	cfg := &v1.ConfigFile{
		Architecture: plat.Architecture,
		Variant:      plat.Variant,
		OS:           plat.OS,
		Created:      v1.Time{Time: created},
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint:   []string{Entrypoint},
			ExposedPorts: ports,
			User:         strconv.Itoa(UID) + ":" + strconv.Itoa(GID),
			WorkingDir:   "/",
			Labels:       labels,
		},
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "deploy/ociimage: /coredns (static, 0755, 65532:65532, cap_net_bind_service=+ep), /compactcache-ctl",
			Comment:   "compactcache",
		},
	})
}

// Layer returns the uncompressed tar of the image's one layer; ctl is the
// admin endpoint's tool, nil for none.
func Layer(bin, ctl, certs []byte, setcap bool, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX})
	}
	if certs != nil {
		for _, d := range []string{"etc/", "etc/ssl/", "etc/ssl/certs/"} {
			if err := dir(d); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeReg, Name: strings.TrimPrefix(CACertsPath, "/"), Mode: 0o644,
			Size: int64(len(certs)), ModTime: mtime, Format: tar.FormatPAX,
		}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(certs); err != nil {
			return nil, err
		}
	}
	h := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     strings.TrimPrefix(Entrypoint, "/"),
		Mode:     0o755,
		Uid:      UID,
		Gid:      GID,
		Size:     int64(len(bin)),
		ModTime:  mtime,
		Format:   tar.FormatPAX,
	}
	if setcap {
		h.PAXRecords = map[string]string{xattrCapability: string(capNetBindService)}
	}
	if err := tw.WriteHeader(h); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if ctl != nil {
		// No capability: it binds nothing.
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeReg, Name: strings.TrimPrefix(CtlPath, "/"), Mode: 0o755, Uid: UID, Gid: GID,
			Size: int64(len(ctl)), ModTime: mtime, Format: tar.FormatPAX,
		}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(ctl); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// elfMachines maps GOARCH to the ELF machine of its binaries.
var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"arm":     elf.EM_ARM,
	"386":     elf.EM_386,
	"ppc64le": elf.EM_PPC64,
	"s390x":   elf.EM_S390,
	"riscv64": elf.EM_RISCV,
}

// checkStatic refuses what cannot run on an empty root file system: anything
// but a Linux ELF executable for plat's architecture without a program
// interpreter or shared libraries.
func checkStatic(data []byte, plat v1.Platform) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if want, ok := elfMachines[plat.Architecture]; ok && f.Machine != want {
		return fmt.Errorf("built for %v, not %s", f.Machine, plat.Architecture)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("ELF type %v is not an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (it has a program interpreter); build with CGO_ENABLED=0")
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("needs shared libraries %v; build with CGO_ENABLED=0", libs)
	}
	return nil
}

// creationTime is SOURCE_DATE_EPOCH, else the commit time the Go toolchain
// recorded in the binary, else the Unix epoch: never the clock, so the same
// binary gives the same image digest. (Run passes the commit's time from git
// when it builds the binary itself.)
func creationTime(bin string) time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	if info, err := buildinfo.ReadFile(bin); err == nil {
		for _, s := range info.Settings {
			if s.Key == "vcs.time" {
				if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
					return t.UTC()
				}
			}
		}
	}
	return time.Unix(0, 0).UTC()
}
